"""What every layer uses and nothing of the pipeline: receipts (provenance, atomic JSON), run options
declared once (options, argtypes), progress, the runtime (device, seeding, threads) and the
statistics. Imports nothing else of glm53_flash; torch-free but for runtime."""

__version__ = "0.1.0"
