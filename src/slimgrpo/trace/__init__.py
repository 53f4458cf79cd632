"""The planner's measuring twin: the update stage run on synthetic tensors (synthetic, step) with every live
byte counted (live_bytes, fake_data, standins), and the table that sets it beside the plan (report)."""
