// stage: prepare (to be written)
