"""The seed derivation: pinned numbers, since runs compare them bit for bit."""

from rollforge.seeds import held_out_seed, mix, replica_seed, sampling_seed


def test_mix_applies_one_prime_per_coordinate():
    assert mix(3) == 3
    assert mix(3, 5) == 3 * 1_000_003 + 5  # a training step's rollout seed
    assert mix(3, 5, 7) == (3 * 1_000_003 + 5) * 1_000_033 + 7
    assert mix(3, 5, 7, 2) == ((3 * 1_000_003 + 5) * 1_000_033 + 7) * 31 + 2


def test_sampling_seed_is_reduced_to_a_positive_31_bit_int():
    # episode 4, turn 2 of a run seeded 0: (0 * 1_000_003 + 4) * 1_000_033 + 2 = 4_000_134
    assert sampling_seed(0, 4, 2) == 4_000_134
    # step 9 of seed 1234 (mix = 1_234_003_711), episode 0, turn 1: reduced modulo 2**31 - 1
    assert sampling_seed(mix(1234, 9), 0, 1) == (1_234_003_711 * 1_000_003 * 1_000_033 + 1) % 2_147_483_647
    assert all(0 <= sampling_seed(2**40 + s, s, s, s) < 2**31 - 1 for s in range(50))


def test_held_out_seeds_are_7919_apart():
    assert held_out_seed(10) == 7929
    assert held_out_seed(10, 2) == 10 + 2 * 7919
    assert held_out_seed(10, 0) == 10


def test_replica_seeds_count_up_and_unseeded_stays_unseeded():
    assert [replica_seed(5, i) for i in range(3)] == [5, 6, 7]
    assert replica_seed(None, 2) is None
