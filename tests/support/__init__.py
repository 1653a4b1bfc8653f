"""What several test folders share: the clean-refusal check, the fuzzers' corruptors and runners, misbehaving HTTP peers."""
