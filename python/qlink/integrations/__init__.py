"""qlink inside its host frameworks: `gptqmodel` and `autoround`, each with install() and
uninstall(). Imported on demand: neither host is a dependency of qlink."""
