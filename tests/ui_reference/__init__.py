"""ComfyUI's own frontend as the reference for the UI-format conversion (comfysup.workflows.ui)."""
