"""Generated wire-protocol modules (built from proto/ by setup.py; never edit them)."""
