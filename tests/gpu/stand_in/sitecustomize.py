"""Imported at start by the server process of the GPU tests' stand-in run (plugin.py puts this
folder, and tests/, on that process's PYTHONPATH, and only that process's): its NumPy backend
opens "CUDA IPC handles" with the host stand-in (support/device_stand_in.py) instead of refusing
them. Nothing else of the server changes."""

from support.device_stand_in import HostDeviceMemory

from tensorbits.backends.numpy_backend import NumpyBackend

NumpyBackend.device_memory = HostDeviceMemory()
