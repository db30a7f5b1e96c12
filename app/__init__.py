"""hangscope: investigate a hung multi-node PyTorch job while it is still hung (login-node side)."""

__version__ = "0.1.0"
