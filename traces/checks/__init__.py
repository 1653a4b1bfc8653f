"""What a trace must satisfy: the checks every table, meta.json and
recording passes before it is written or when it is opened.

- ``frame_checks``: each table against its schema (types, ranges, nulls,
  uniqueness) and its cast to the schema's exact Arrow types;
- ``meta_checks``: the keys of meta.json that commands read, checked for
  type when a trace is opened;
- ``consistency``: a recording's tables against each other (a step before
  its request arrived, more tokens scheduled than a request holds, more KV
  blocks than the instance has).

May import ``traces.datamodel`` and ``traces.errors`` only: the store and
the importers call these, so they import neither.
"""
