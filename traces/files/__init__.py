"""The file boundary: what latroute may read, and how and where it writes.

- ``paths``: every input path enters here (no FIFO, device or socket; text
  decoded strictly), so a bad path is refused before any work;
- ``jsonio``: strict JSON in and out (no NaN, Infinity or overflowing
  numbers);
- ``outputs``: outputs are built beside their final place and renamed in
  when complete; ``output_checks``: what an output may replace (only what
  latroute wrote).

May import ``traces.errors`` only: the vLLM recorder reads through
``paths`` inside vLLM's own process, and every other room writes through
these, so they import none of them.
"""
