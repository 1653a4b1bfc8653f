"""Sweeps: many twin replays (rates x routers x deltas x lambdas x seeds).

``driver`` builds and summarises the cells, ``backends`` runs them on a local
process pool or Ray, ``store`` writes every finished cell at once so a study
survives a crash. Confidence intervals over paired seeds are
``reports.paired_stats`` (reports read them too).

May import ``harness.twin`` and the layers below the harness; not the
command line.
"""
