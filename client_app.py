"""Flower ClientApp: wiring only. The path a message takes is chosen here, once: the cached
features (`ovalp_flwr.ova.client`, `finetune = "none"`) or the encoder (`ovalp_flwr.finetune.client`)."""

from types import ModuleType

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from ovalp_flwr.core.memory import return_large_frees
from ovalp_flwr.federation import simulation_queue
from ovalp_flwr.federation.attacks import attack_mod
from ovalp_flwr.federation.chaos import chaos_mod
from ovalp_flwr.finetune import client as encoder_path
from ovalp_flwr.ova import client as feature_path


def path_of(context: Context) -> ModuleType:
    """The module whose handlers serve this run."""
    if context.run_config.get("finetune", "none") == "none":
        return feature_path
    return encoder_path


def handler(name: str):
    """The run's path's handler `name`."""

    def handle(msg: Message, context: Context) -> Message:
        return getattr(path_of(context), name)(msg, context)

    handle.__name__ = name
    return handle


# in the simulation runtime's process: its message loop in one scan per pass, not one per node
simulation_queue.install()
# a client's Gram statistics are megabytes made once: freed, they go back to the system
return_large_frees()
# one_thread_mod: the cached path's tiny head math on one CPU thread, per message
app = ClientApp(mods=[feature_path.one_thread_mod])
# chaos_mod: only on nodes whose --node-config names a `chaos` kind (fault rehearsals);
# attack_mod: only on the clients the run's `attack` rehearsal picks (hostile, well-formed):
# their updates, and the statistics and sample counts of the set-up queries
app.train(mods=[chaos_mod, attack_mod, feature_path.secure_statistics_mod])(handler("train"))
app.evaluate()(handler("evaluate"))
app.query("describe", mods=[attack_mod])(handler("describe"))
app.query("set_norm", mods=[attack_mod])(handler("set_norm"))
app.train("personalize")(handler("personalize"))
app.evaluate("personalized")(handler("score_personalized"))
