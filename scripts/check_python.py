"""Refuse, before anything is installed, an interpreter older than settings.ini's `min_python` (what the requirements need)."""
import configparser, sys
need = configparser.ConfigParser(delimiters=["="])
need.read("settings.ini", encoding="utf-8")
want = tuple(int(x) for x in need["DEFAULT"]["min_python"].split("."))
if sys.version_info[:len(want)] < want:
    sys.exit(f"codellm_nb needs Python {'.'.join(map(str, want))} or newer (its requirements do); {sys.executable} is "
             f"{sys.version.split()[0]}: run make with PYTHON=python{'.'.join(map(str, want))} (or newer)")
