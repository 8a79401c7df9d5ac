"""Flower ClientApp: wiring only (handlers live in `ovalp_flwr.ova.client`)."""

from flwr.clientapp import ClientApp

from ovalp_flwr.ova import client
from ovalp_flwr.federation.chaos import chaos_mod

app = ClientApp()
# chaos_mod: only on nodes whose --node-config names a `chaos` kind (fault rehearsals)
app.train(mods=[chaos_mod, client.secure_statistics_mod])(client.train)
app.evaluate()(client.evaluate)
app.query("describe")(client.describe)
app.query("set_norm")(client.set_norm)
app.train("personalize")(client.personalize)
app.evaluate("personalized")(client.score_personalized)
