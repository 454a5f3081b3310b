"""tff-dp: client-level differentially private federated learning with
compressed communication, as TensorFlow Federated components."""

from tff_dp.runtime import processes  # noqa: F401  (registers the atexit cleanup)

# The one place the version is stated: setup.py reads this line, and
# CITATION.cff and CHANGELOG.md's newest entry agree with it (tested).
__version__ = '0.6.4'
