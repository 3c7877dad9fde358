"""Stand-in for gptqmodel.utils.offload: offload_to_disk names the module it writes by a walk of
every module of the model (get_module_fullname) and records the name here (OFFLOADED)."""

OFFLOADED = []


def get_module_fullname(model, module):
    for name, mod in model.named_modules():
        if mod is module:
            return name
    raise Exception("module not found in model: module = %s" % (module,))


def offload_to_disk(module, model, disk_path="."):
    OFFLOADED.append(get_module_fullname(model=model, module=module))
