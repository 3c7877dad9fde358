"""Stand-in for gptqmodel.looper.forward_executor: run_parallel binds the clone function as
a default argument when the class is defined, as the host does."""
import threading

from ..utils.looper_helpers import clone_module_for_devices, forward_batch_worker
from ..utils.model import move_to, nested_move_to  # noqa: F401  (imported by name, as the host does)


class ForwardExecutor:
    def run_parallel(self, *, module, layer_inputs, layer_input_kwargs, devices,
                     clone_module_for_devices_fn=clone_module_for_devices,
                     forward_batch_worker_fn=forward_batch_worker):
        """Batch i on devices[i % len(devices)], one thread per device; outputs in batch order."""
        replicas = clone_module_for_devices_fn(module, devices)
        outputs, errors = [None] * len(layer_inputs), []

        def work(d):
            replica = replicas[devices[d]]
            try:
                for i in range(d, len(layer_inputs), len(devices)):
                    outputs[i] = forward_batch_worker_fn(replica, layer_inputs[i], layer_input_kwargs[i])
            except Exception as error:  # re-raised by the caller's thread below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(d,)) for d in range(len(devices))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return outputs
