"""PyTorch integration: ``torch.ops.etvk.*`` (`torch_ops`) and graph passes over
``torch.export`` programs (`passes`)."""
