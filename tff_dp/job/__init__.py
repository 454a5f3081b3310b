"""The job behind `python -m tff_dp.run`, flag-free.

A run's configuration and its checks (`experiment_config`), its cohorts
(`cohorts`: Poisson, fixed-size and cyclic draws), its noise across rounds
(`noise_plan`) and the guard on reused noise seeds (`noise_seeds`), the
learning process built from them (`preparation`), the round loop
(`training`) and what a run writes (`outputs`).

May import: `tff_dp.aggregators`, `tff_dp.tasks`, `tff_dp.client_works`,
`tff_dp.privacy`, `tff_dp.methods`, `tff_dp.runtime`. Not `tff_dp.reporting`
or the binaries (`tests/layout_test.py`).
"""
