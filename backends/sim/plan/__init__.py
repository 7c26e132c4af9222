"""Virtual time: the same engine core driven without sleeping; `zerogap sim plan` sweeps, stepped runs,
pool predictions and the capacity answer."""
