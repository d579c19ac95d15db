"""What tests/unit and tests/e2e both build on, and no test of its own: tiny checkpoints of every family, the
hub's dataset layouts, the export helpers, a tagged tiny model, a finished run's files and a corpus that validates."""
