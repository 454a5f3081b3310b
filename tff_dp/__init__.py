"""tff-dp: client-level differentially private federated learning with
compressed communication, as TensorFlow Federated components."""

from tff_dp import processes  # noqa: F401  (registers the atexit cleanup)

__version__ = '0.1.0'
