"""Reading what runs wrote and checking the mechanisms: plots of run
folders (`run_folders`, `run_plots`) and the frontier of the studies'
results (`frontier`, the model; `frontier_words`; `frontier_plot`), in each
method's style (`styles`) and shared words (`wording`); and the empirical
privacy audit with its planted bugs (`audit`).

May import every other package of tff_dp except the binaries
(`tests/layout_test.py`); nothing imports reporting but the binaries,
benchmarks and tests.
"""
