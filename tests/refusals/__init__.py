"""Bad input refused: one line naming the file, row, column or option, exit 2, before any work, nothing written."""
