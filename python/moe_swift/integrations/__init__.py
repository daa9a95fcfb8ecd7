"""Drop-in use of moe_swift from other frameworks: `integrations.transformers` (the
experts backend of transformers 5). Each module imports its framework lazily."""
