"""Where PyInstaller finds edgeinfer: where this interpreter imports it from (an editable
install maps it to a folder of the checkout, which PyInstaller cannot see by itself)."""

from edgeinfer.__pyinstaller import package_search_dirs


def pre_find_module_path(api):
    found = package_search_dirs(api.module_name)
    if found is not None:
        api.search_dirs = found
