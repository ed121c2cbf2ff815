"""Imported at start by the server process of the GPU tests' stand-in run (plugin.py puts this
folder, and tests/, on that process's PYTHONPATH, and only that process's): its NumPy backend
opens "CUDA IPC handles" with the server's own CUDA IPC code (cuda_ipc.CupyDeviceMemory: the
size queries through ctypes, open, view, close) over the host stand-in for CuPy and the driver
(support/cuda_stand_in.py) instead of refusing them. Nothing else of the server changes."""

from support.cuda_stand_in import CudaStandIn

from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.cuda_ipc import CupyDeviceMemory

_cuda = CudaStandIn()
NumpyBackend.device_memory = CupyDeviceMemory(_cuda.cupy, _cuda.device_id, driver=_cuda.driver)
