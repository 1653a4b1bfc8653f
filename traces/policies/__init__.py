"""The per-request policies: what a run assumes of each request when its
trace does not say, chosen by name on every command that replays a trace.

- ``slo``: each request's TTFT target (the trace's column, the paper's
  rule on the prompt length, or a constant);
- ``quality``: each (request, model)'s realised and predicted accuracy
  (the trace's table, or the paper's per-task means);
- ``lengths``: the predicted output lengths routers and estimators are
  told (a predictor's column, the traffic's median, a constant, or the
  truth, as an oracle that says so);
- ``tasks``: the paper's task table those rules and the workload generator
  draw from (length medians, per-model judge accuracies).

May import ``traces.files`` (a quality table read from a file) and
``traces.errors`` only: the workload generator and every command above
take their defaults from here.
"""
