"""Hydra search-path plugin shipped with pettingllms-verl (Hydra finds it in the ``hydra_plugins``
namespace package, see https://hydra.cc/docs/advanced/search_path/).

It appends verl's config package and the recipes to every Hydra app's config search path, so that
a recipe need not write ``hydra.searchpath`` and ``python -m verl.trainer.main_ppo --config-name
<recipe>`` finds a shipped recipe without ``--config-path``. Appended: the app's own configs (and
``--config-path``) keep precedence. Kept import-light: Hydra imports it in every Hydra app.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "pettingllms_verl"
PATHS = ("pkg://verl.trainer.config", "pkg://pettingllms_verl.recipes")


class PettingLLMsSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for path in PATHS:
            search_path.append(provider=PROVIDER, path=path)
