"""`zerogap tune`: try engine settings on a real or simulated pool (or in virtual time),
rank them by goodput under the SLOs, and say why each one's TPS stops growing."""
