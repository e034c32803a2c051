"""What TRACE decides: the success predictor, the root and prefix solvers, the allocators (TRACE and its
baselines), the step's pure stages and the driver of one step."""
