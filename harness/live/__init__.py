"""What touches a real engine or server: recording a real vLLM engine
(``record``, library side of ``latroute record``) and open-loop load on an
OpenAI-compatible endpoint (``loadgen``).

May import ``traces`` and ``harness.twin``; heavy optional packages (aiohttp)
are imported lazily.
"""
