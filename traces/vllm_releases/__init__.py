"""What vLLM's releases do that a trace does not say: the engine defaults
each release fills in, and which releases the scheduler kernel was checked
against.

- ``defaults``: vLLM's documented engine defaults per release and GPU
  class (``EngineArgs``' usage-context table), the source of every
  defaulted setting an importer marks;
- ``versions``: the releases the kernel reproduces and the window of
  releases whose scheduling rules it follows (0.19.0 to 0.32.x), so the
  importers refuse a version outside it unless accepted and ``validate``
  warns on a recording of one.

Plain tables: imports nothing of latroute but itself. The importers and
the harness read these; neither vLLM nor the recorder is imported here.
"""
