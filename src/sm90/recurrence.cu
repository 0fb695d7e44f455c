// stage: recurrence (to be written)
