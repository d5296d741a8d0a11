"""PDS: the epoch planner (Algorithm 1) and the placement it shares with the extender."""

from elastico_extender.core.planner.admission import Answers, NodeVerdict, PlacementView
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.epoch import plan
from elastico_extender.core.planner.placement import Placed, Placer

__all__ = ["Answers", "DeviceTable", "NodeVerdict", "Placed", "PlacementView", "Placer", "plan"]
