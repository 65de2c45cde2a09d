"""What every layer uses and nothing of the pipeline: receipts (provenance, atomic JSON), run options
declared once (options, argtypes), progress, the runtime (device, memory, seeding), running beside other
work (shared_machine: spin waits, the thread governor) and the statistics. Imports nothing else of
glm53_flash; torch is imported only inside functions of runtime and shared_machine."""

__version__ = "0.1.0"
