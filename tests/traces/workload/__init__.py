"""Tests of traces/workload/: arrival processes, the workload generator, sessions, fleet-sized workloads."""
