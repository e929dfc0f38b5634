"""``rollforge.train``'s own names, as the README imports them: the run's entry points are the
launch recipe's (``recipes/launch.py``), the config the library's."""

import rollforge.train
from rollforge.recipes import launch
from rollforge.train import TrainConfig, TrainResult, atrain, load_config, train
from rollforge.train import config as config_module


def test_the_readme_imports_work_and_are_the_loop_s_own():
    assert train is launch.train and atrain is launch.atrain and TrainResult is launch.TrainResult
    assert TrainConfig is config_module.TrainConfig and load_config is config_module.load_config
    assert (
        rollforge.train.__all__
        == sorted(rollforge.train.__all__)
        == [
            "TrainConfig",
            "TrainResult",
            "atrain",
            "load_config",
            "train",
        ]
    )
