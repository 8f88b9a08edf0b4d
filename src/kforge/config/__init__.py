"""forge.toml and what a user types: the model and its schema, options, targets, variants, release matrix, wheel names."""
