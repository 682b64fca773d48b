"""The EAGLE-3 draft head: config, vocabulary mapping, training-time-test attention and loss."""
