"""The job behind `python -m tff_dp.run`, flag-free.

A run's configuration and its checks (`experiment_config`), its cohorts
(`cohorts`: Poisson, fixed-size and cyclic draws), its noise across rounds
(`noise_plan`) and the guard on reused noise seeds (`noise_seeds`), the
learning process built from them (`preparation`), the round loop
(`training`, a trained round's finishing in `round_finishing`) and what a
run writes: its rows, metrics.csv and progress lines (`metrics_log`),
TensorBoard events (`events_file`), checkpoints in its secret folder
(`checkpoints`), the run folder's files (`run_files`) and summary.json's
privacy section and provenance (`privacy_summary`, `provenance`).

May import: `tff_dp.aggregators`, `tff_dp.tasks`, `tff_dp.client_works`,
`tff_dp.privacy`, `tff_dp.methods`, `tff_dp.runtime`. Not `tff_dp.reporting`
or the binaries (`tests/layout_test.py`).
"""
