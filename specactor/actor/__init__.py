"""Actor runtime: Actor base, ZeroMQ mailboxes, addresses, supervisor, processes."""

from specactor.actor.base import SUPERVISOR, Actor
from specactor.actor.address import Transport
from specactor.actor.actor_spec import ActorSpec, class_path
from specactor.actor.system import ActorSystem

__all__ = ["Actor", "ActorSpec", "ActorSystem", "SUPERVISOR", "Transport", "class_path"]
