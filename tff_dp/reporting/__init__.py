"""Reading what runs wrote and checking the mechanisms: plots of run
folders and of the studies' results (`plot`), and the empirical privacy
audit with its planted bugs (`audit`).

May import every other package of tff_dp except the binaries
(`tests/layout_test.py`); nothing imports reporting but the binaries,
benchmarks and tests.
"""
