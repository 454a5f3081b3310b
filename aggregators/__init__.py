"""tff_dp.aggregators: one TFF aggregation factory per technique.

Factories land here as the technique issues are built; each module stands on
TFF, tensorflow-privacy and dp_accounting alone.
"""
