import pytest

from training.evaluation.metrics import mean_pass_at_k, pass_at_k


def test_pass_at_k_hand_computed() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the plain success rate: 2/5
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    # n=10, c=1, k=5: 1 - C(9,5)/C(10,5) = 1 - 126/252 = 0.5
    assert pass_at_k(10, 1, 5) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k failures: any k draws include a pass


def test_mean_and_errors() -> None:
    assert mean_pass_at_k([(5, 2), (5, 0)], 1) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
