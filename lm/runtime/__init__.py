"""The machine a job runs on: ``device`` (device, autocast dtype, torch.compile), ``host``
(host memory, stop signals) and ``distributed`` (torchrun: process group, collectives, shared
failures). Training, sampling and evaluation all stand on it."""
