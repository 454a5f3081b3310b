"""Where the rounds run: TFF execution contexts (`contexts`), the
`worker_binary` processes and their cleanup (`processes`), scale-out over
workers (`distributed`), one TensorFlow call per client (`fusion`), the
learning process from client work and aggregator (`composition`) and the
test-set evaluation beside training (`evaluation`).

May import: `tff_dp.aggregators`, `tff_dp.tasks`, `tff_dp.client_works`
(`tests/layout_test.py`). Nothing here knows a run's configuration.
"""
