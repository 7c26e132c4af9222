"""The backends of each model: routing policies, health checks and load scrapes, requests in flight,
passive outlier ejection, drain on SIGTERM."""
