"""The twin checked against real recordings.

- ``validate``: twin fidelity against a recording (``latroute validate``);
- ``decisions``: decision agreement (does the scheduler kernel choose the
  batches a real engine chose?).

May import ``traces``, ``estimators`` and the twin's simulation; nothing in
the twin imports this room.
"""
