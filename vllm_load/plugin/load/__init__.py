"""The load a process generates: the users, the generator of requests and its pacing, warm-up, steady window, drain and the server's refusals."""
