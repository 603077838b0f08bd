"""Pipeline parallel: stages cut from the model (stages.py), laid out and scheduled (apply.py), and the
module that holds this rank's stages and runs the schedule (model.py)."""
