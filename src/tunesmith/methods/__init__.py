"""Training methods: one module per stage (see stages.py for which stage uses which), plus pure loss
functions (losses.py, policy_losses.py, advantages.py) registered by name. A method gets the model's
outputs and the batch; it never calls the model and never sees the backend."""
