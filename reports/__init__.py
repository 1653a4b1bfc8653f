"""Reports: tables, figures and result pages made from results already
written (sweep cells, estimate and replay outputs).

May import ``traces`` only (paths, JSON and errors); never estimators,
routers or the harness: a report reads results, it does not make them
(``lint-imports``).
"""
