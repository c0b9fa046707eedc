"""Stray tokens: words cut open by pieces of another sequence (``detector.stray``), and the
healthy text that looks like them (identifiers, compounds, paths, other languages)."""

from __future__ import annotations

import pytest

from harness.verdict import classify_turn
from harness.verdict.detector import stray
from harness.verdict.detector.fitted import model
from harness.verdict.detector.text import TOKEN_SALAD, score_text

CORRUPT = [
    # two English words cut open by pieces of other words, close together
    "I looked at the configuration file and the deploymoxent script. The problem is in the "
    "authentbrication step, which runs before the network is ready.",
    "The parser reads each line of the input, splits it into fields and stores the resuklults "
    "in a list. After that it sorts the list and writes the outpaxut to a new file.",
    # one word cut open by a piece of another script
    "The function returns a dicti이onary with the parsed values and an optional warning "
    "message when the input is empty.",
]

HEALTHY = [
    # identifiers, CamelCase, a path, a URL
    "I updated `src/utils/parseConfig.ts` and `getUserName()` so that the `MatrixElement` "
    "class reads https://example.com/api/v2/items?id=42 correctly.",
    "Then I renamed FileItemFactory to FileItemBuilder and moved getattr(other, name) into "
    "the helper; struct.Struct and os.path.join are unchanged.",
    # Chinese prose with Latin identifiers
    "我们需要修改 `config.yaml` 里的 redisHost 和 maxRetries 两个参数，然后重启 UserService "
    "服务，再运行 npm test 检查结果。",
    # compounds, elisions, emoji
    "The re-run of the follow-up job is self-contained: it re-reads the well-known settings "
    "and writes a read-only copy. 🚀 All good ✅ and they're done.",
    # math
    "We solve x² + 3x − 4 = 0: the roots are x = 1 and x = −4, so f(x) = (x − 1)(x + 4) "
    "and its integral is a cubic.",
    # another language, names and rare words
    "Buenos días. Para terminar la reserva necesito saber la fecha de llegada, el número de "
    "huéspedes y si prefieren habitación doble o individual con desayuno incluido.",
    "The Huancayo and Cajamarca offices of Ferreterías Quispe reopened on Wednesday; the "
    "bulletin lists the refurbishments, the reimbursements and the apprenticeships.",
    # commands
    "Run `pytest -k test_parse_headers` and then `git commit -am 'fix headers'`; the CI "
    "workflow in .github/workflows/ci.yml does the rest.",
    "Let me check the deployment logs first, and then I will look at the authentication "
    "middleware that handles the session cookies.",
]


@pytest.mark.parametrize("text", CORRUPT)
def test_words_cut_open_are_salad(text: str) -> None:
    found = score_text(text)
    assert found.label == TOKEN_SALAD
    assert found.signals.get("stray_tokens", 0) >= 1
    assert found.offset is not None
    assert text[found.offset - 1].isalpha()
    assert classify_turn(text, source="server").corrupted


@pytest.mark.parametrize("text", HEALTHY)
def test_healthy_look_alikes_have_no_stray_tokens(text: str) -> None:
    fitted = model.load()
    assert stray.events(text, fitted.words, fitted.chars) == []
    assert "stray_tokens" not in score_text(text).signals


def test_a_word_cut_open_is_repaired_to_the_word() -> None:
    fitted = model.load()
    text = CORRUPT[0]
    words = {(core, word) for _, core, word, _ in stray.repaired(text, fitted.words, fitted.chars)}
    assert ("deploymoxent", "deployment") in words
    assert ("authentbrication", "authentication") in words


def test_one_word_cut_open_by_the_same_script_is_not_enough_for_the_word_model() -> None:
    """A lone repaired word of the same script is what hash collisions and rare words give
    the word model: its reading takes two close together."""
    fitted = model.load()
    one = (
        "I looked at the configuration file and the deployment script. The problem is in the "
        "authentbrication step, which runs before the network is ready."
    )
    assert stray.model_events(one, fitted.words, fitted.chars) == []


# Ordinary English prose with pieces of other words inside its words: what the lexicon reads.
LEXICON_CORRUPT = [
    # two words cut open, close together
    "The bridge was closed for three weeks while the crews replaced the rusted cablutes and "
    "repainted the raimelings along the walkway.",
    "Before you plant the seeds, soak them overnight, then press them into moist sonkail "
    "about a centimeter deep and keep the tray in a wamrirm place.",
    # one word that English never writes, repaired into a long common word
    "The committee met on Tuesday to review the budget and agreed to postpone the vote until "
    "the audiqtors had finished their report on the spending.",
    "Our grandmother kept a small garden behind the house where she grew tomatoes, beans and "
    "a few rows of strawberries for the whole commupanity every summer.",
    # one word cut open alone, with a junction clean text almost never writes
    "The moon orbits the earth and its gravity pulls on the ocejkans, which causes the tides "
    "to rise and fall twice a day along most coasts.",
    "To reset the router, hold the button on the back for ten seconds and wait for the "
    "lights to blink, then reconnect your devirtces and try again.",
    # two words cut open by capitalised pieces of other words
    "Knead the dough for ten minutes, let it rest in a warm place, and then shape the "
    "loaves. BaWheking them for forty minutes gives a crust that is golden and a crumb "
    "that is soft, and the kitchen smells of breTheaad for hours.",
]

LEXICON_HEALTHY = [
    # rare real words, written once each
    "The archivist catalogued the palimpsests, the incunabula and a few marginalia that the "
    "monks had left in the scriptorium before the abbey was dissolved.",
    "The recipe calls for a roux, a bouquet garni and a splash of vermouth; deglaze the pan "
    "and let the sauce reduce until it coats the back of a spoon.",
    # jargon, lower-case tool names and derived words
    "I ran kubectl rollout restart, then checked the nginx logs and the sqlalchemy pool; the "
    "healthcheck passed after the redeployment and the autoscaler settled.",
    "The refactor unmerges the two caches, stringifies the keys and deduplicates the entries "
    "before the serializer writes them out.",
    # prose in other languages
    "Para terminar la solicitud necesito confirmar la dirección de envío, el número de "
    "contacto y si prefieres recibir las notificaciones por correo electrónico.",
    "Il faut vérifier les paramètres de connexion et redémarrer le service avant de relancer "
    "les tests automatisés sur la branche principale.",
    "Precisamos verificar as configurações do servidor e reiniciar o serviço antes de "
    "executar novamente os testes automatizados na ramificação principal.",
    # typos the user wrote, quoted back
    'You asked about "recieve" and "seperate": both are misspelled, the right forms are '
    '"receive" and "separate", and the rest of your message reads fine.',
    # names of two words joined, one capital inside
    "Specifically, the test that fails is in the TestQuerying class, and the same check in "
    "the DeepSeek client passes; the YouTube and LinkedIn exports are unaffected.",
    # code
    "def lerp(a, b, t):\n    return a + (b - a) * t\n\nprint(lerp(0, 10, 0.25))  # 2.5",
]


@pytest.mark.parametrize("text", LEXICON_CORRUPT)
def test_the_lexicon_repairs_words_cut_open(text: str) -> None:
    fitted = model.load()
    assert stray.lexicon_events(text, fitted.words, fitted.chars)
    found = score_text(text)
    assert found.label == TOKEN_SALAD
    assert classify_turn(text, source="server").corrupted


@pytest.mark.parametrize("text", LEXICON_HEALTHY)
def test_the_lexicon_leaves_healthy_look_alikes(text: str) -> None:
    fitted = model.load()
    assert stray.lexicon_events(text, fitted.words, fitted.chars) == []
    assert "stray_tokens" not in score_text(text).signals


def test_the_lexicon_names_the_repaired_word() -> None:
    fitted = model.load()
    found = {(w, r) for _, w, r, _ in stray.lexicon_cut(LEXICON_CORRUPT[0], fitted.words)[0]}
    # (the most common word a piece taken out makes: ``rings`` is more common than ``railings``)
    assert found == {("cablutes", "cables"), ("raimelings", "rings")}


def test_a_word_written_several_times_is_a_word_of_the_text() -> None:
    """A rare word written several times is a word of the text, not a stray piece."""
    fitted = model.load()
    text = (
        "The deploymoxent failed. Then the deploymoxent ran again and the deploymoxent logs "
        "show the same error in the network step of the build."
    )
    assert stray.events(text, fitted.words, fitted.chars) == []


def test_other_script_inside_a_latin_word() -> None:
    assert stray.other_script("dictionary", "이")
    assert stray.other_script("service", "服务")
    assert not stray.other_script("service", "r")
    assert not stray.other_script("servicio", "ó")  # (Latin-1: one of Latin's own letters)


def test_the_lexicon_reads_no_quoted_name() -> None:
    """A name in backticks or quotes is a name of a thing, not a word of prose."""
    fitted = model.load()
    text = (
        "To fix the circular import, move the imports of getattrs and of the other helper "
        "into the functions that use them, then run the tests again."
    )
    assert [w for _, w, _, _ in stray.lexicon_cut(text, fitted.words)[0]] == ["getattrs"]
    for quoted in ("`getattrs`", '"getattrs"', "'getattrs'"):
        assert stray.lexicon_cut(text.replace("getattrs", quoted), fitted.words)[0] == []
