"""`zerogap sim calibrate`: fit the [sim] cost model to stepped load-test runs."""
