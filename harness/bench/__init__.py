"""``latroute bench``: the project's speed and memory figures, each measured as
ratios within one run where the machine's noise would swamp an absolute
figure, with compile time reported apart from steady-state time.

May import anything below the command line.
"""
