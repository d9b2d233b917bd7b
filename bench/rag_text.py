"""Deterministic, varied English prose for the retrieval benchmark.

Uniform random vectors make HNSW look terrible (no structure to exploit) and real corpora are
clustered by topic, so the benchmark writes passages the way documentation and articles read:
each passage belongs to one domain and one topic inside it, mixes that topic's vocabulary with
common words, names, places and numbers, and is built from varied sentence templates.
Changing anything here changes the text and so invalidates the cached embeddings (VERSION).
"""

from __future__ import annotations

import random

VERSION = "rag-text-v1"

DOMAINS: dict[str, dict[str, list[str]]] = {
    "networking": {
        "nouns": "router packet latency subnet firewall gateway switch bandwidth protocol "
        "handshake socket certificate proxy tunnel".split(),
        "verbs": "routes drops forwards encrypts throttles inspects retransmits negotiates".split(),
        "adjs": "congested redundant encrypted lossy wireless segmented".split(),
    },
    "cooking": {
        "nouns": "dough oven sauce broth skillet garlic saffron pastry marinade knife butter "
        "caramel stock recipe".split(),
        "verbs": "simmers kneads roasts seasons whisks braises folds reduces".split(),
        "adjs": "crispy tender smoky savory golden buttery".split(),
    },
    "astronomy": {
        "nouns": "telescope nebula comet orbit galaxy pulsar eclipse spectrum quasar asteroid "
        "moon supernova constellation observatory".split(),
        "verbs": "observes orbits emits collapses rotates eclipses tracks measures".split(),
        "adjs": "distant faint luminous binary stellar cosmic".split(),
    },
    "finance": {
        "nouns": "bond dividend portfolio equity ledger invoice mortgage inflation audit "
        "budget hedge liquidity loan interest".split(),
        "verbs": "invests audits hedges borrows lends reconciles forecasts allocates".split(),
        "adjs": "volatile fiscal quarterly solvent leveraged taxable".split(),
    },
    "gardening": {
        "nouns": "compost seedling trellis mulch tomato orchard greenhouse soil pruning "
        "irrigation bulb hedge rose fertilizer".split(),
        "verbs": "waters prunes plants harvests grafts sows mulches fertilizes".split(),
        "adjs": "perennial fertile shaded sandy blooming organic".split(),
    },
    "medicine": {
        "nouns": "vaccine dosage symptom clinic diagnosis antibiotic surgeon fracture "
        "allergy therapy nurse pulse infection prescription".split(),
        "verbs": "diagnoses treats prescribes examines vaccinates monitors sutures admits".split(),
        "adjs": "chronic acute sterile clinical benign contagious".split(),
    },
    "law": {
        "nouns": "contract verdict appeal statute clause tenant liability plaintiff court "
        "testimony patent lease jury warrant".split(),
        "verbs": "litigates rules appeals drafts enforces testifies settles amends".split(),
        "adjs": "binding statutory void civil criminal contractual".split(),
    },
    "music": {
        "nouns": "melody chord violin rhythm symphony tempo choir harmony guitar orchestra "
        "piano lyric concert drummer".split(),
        "verbs": "composes rehearses conducts improvises tunes records performs arranges".split(),
        "adjs": "melodic harmonic acoustic baroque syncopated minor".split(),
    },
    "sailing": {
        "nouns": "mast hull keel anchor harbor tide rudder spinnaker mooring compass buoy "
        "regatta jib deck".split(),
        "verbs": "tacks anchors moors steers navigates hoists reefs capsizes".split(),
        "adjs": "windward leeward nautical tidal choppy sheltered".split(),
    },
    "databases": {
        "nouns": "index query transaction replica schema vacuum deadlock cursor partition "
        "snapshot checkpoint table tuple planner".split(),
        "verbs": "indexes replicates commits locks vacuums partitions caches plans".split(),
        "adjs": "durable concurrent relational normalized sharded consistent".split(),
    },
    "geology": {
        "nouns": "basalt glacier fault magma sediment quartz volcano erosion fossil mineral "
        "canyon granite earthquake strata".split(),
        "verbs": "erodes deposits erupts fractures crystallizes shifts weathers uplifts".split(),
        "adjs": "volcanic sedimentary igneous tectonic porous ancient".split(),
    },
    "aviation": {
        "nouns": "runway cockpit turbine altimeter pilot hangar fuselage autopilot airspace "
        "propeller flap radar glider landing".split(),
        "verbs": "lands climbs taxis banks cruises descends refuels deploys".split(),
        "adjs": "supersonic pressurized airborne turbulent commercial regional".split(),
    },
    "education": {
        "nouns": "curriculum lecture syllabus student exam tutor semester classroom thesis "
        "scholarship grade library campus seminar".split(),
        "verbs": "teaches grades studies enrolls lectures mentors assesses graduates".split(),
        "adjs": "academic remedial elective bilingual rigorous vocational".split(),
    },
    "chemistry": {
        "nouns": "catalyst molecule reaction solvent isotope polymer acid enzyme beaker "
        "titration electron oxidation compound crystal".split(),
        "verbs": "reacts dissolves oxidizes catalyzes distills bonds neutralizes ionizes".split(),
        "adjs": "volatile inert acidic organic soluble exothermic".split(),
    },
    "football": {
        "nouns": "goalkeeper penalty striker midfield referee tournament stadium tackle "
        "offside league coach header fixture trophy".split(),
        "verbs": "scores defends passes tackles dribbles coaches qualifies substitutes".split(),
        "adjs": "defensive attacking aerial tactical relegated unbeaten".split(),
    },
    "photography": {
        "nouns": "aperture shutter lens tripod exposure sensor portrait flash negative "
        "darkroom zoom histogram filter composition".split(),
        "verbs": "captures frames exposes focuses develops crops zooms edits".split(),
        "adjs": "panoramic monochrome overexposed candid macro blurry".split(),
    },
    "energy": {
        "nouns": "turbine battery grid reactor solar inverter pipeline transformer megawatt "
        "hydrogen substation dam emission wind".split(),
        "verbs": "generates stores transmits converts ramps curtails balances meters".split(),
        "adjs": "renewable nuclear intermittent thermal offshore carbon".split(),
    },
    "history": {
        "nouns": "empire treaty dynasty revolution archive monarch siege manuscript colony "
        "parliament artifact chronicle rebellion crusade".split(),
        "verbs": "conquers signs abdicates rebels chronicles colonizes besieges reforms".split(),
        "adjs": "medieval imperial colonial ancient feudal victorian".split(),
    },
    "robotics": {
        "nouns": "actuator servo gripper lidar controller manipulator odometry sensor "
        "firmware encoder chassis kinematics torque drone".split(),
        "verbs": "grasps calibrates navigates senses actuates localizes maps balances".split(),
        "adjs": "autonomous robotic articulated embedded precise mobile".split(),
    },
    "textiles": {
        "nouns": "loom thread fabric weave dye cotton wool silk seam needle pattern spindle "
        "embroidery linen".split(),
        "verbs": "weaves dyes stitches spins knits hems embroiders bleaches".split(),
        "adjs": "woven coarse knitted breathable waterproof handmade".split(),
    },
}

COMMON_NOUNS = (
    "team report week morning city committee plan year result question problem method system "
    "process change guide rule season winter summer evening engineer manager visitor country "
    "river road village market office museum budget schedule".split()
)
COMMON_ADJS = "new old careful early late small large simple difficult local regional".split()
NAMES = (
    "Amara Bjorn Chen Dalia Emeka Farah Gustavo Hana Ivan Jonas Keiko Lena Mateo Nadia Omar "
    "Priya Quentin Rosa Sven Tariq Uma Viktor Wen Xavier Yara Zofia".split()
)
PLACES = (
    "Lisbon Nairobi Oslo Kyoto Quito Dublin Hanoi Cairo Austin Perth Tallinn Porto Lagos "
    "Bergen Seville Krakow Halifax Osaka Lima Tromso".split()
)

TEMPLATES = [
    "The {adj} {noun} {verb} the {noun2} before the {common} ends.",
    "In {place}, {name} {verb} a {adj} {noun} every {common}.",
    "{name} explained that the {noun} {verb} faster when the {noun2} is {adj}.",
    "A {cadj} {common} showed that {num} {noun}s were {adj} by {year}.",
    "Most {noun}s in {place} are {adj}, but the {noun2} {verb} differently.",
    "Why does the {noun} matter? Because it {verb} the {adj} {noun2}.",
    "According to the {common}, the {noun2} {verb} about {num} times a {common2}.",
    "{name} and {name2} compared the {adj} {noun} with a {cadj} {noun2} in {year}.",
    "When the {noun} fails, the {common} {verb} the {noun2} and waits for {name}.",
    "Every {adj} {noun} needs a {noun2}; without one the {common} becomes {cadj}.",
    "The {common} in {place} measured the {noun} at {num} units during the {common2}.",
    "{name} wrote a {cadj} guide on how the {noun} {verb} the {noun2}.",
]


def _sentence(rng: random.Random, domain: dict[str, list[str]], focus: list[str]) -> str:
    # Two thirds of the nouns come from the passage's topic, the rest from the whole domain:
    # passages of one topic cluster together, topics of one domain stay near each other.
    def noun() -> str:
        return rng.choice(focus) if rng.random() < 0.67 else rng.choice(domain["nouns"])

    text = rng.choice(TEMPLATES).format(
        adj=rng.choice(domain["adjs"]),
        noun=noun(),
        noun2=noun(),
        verb=rng.choice(domain["verbs"]),
        common=rng.choice(COMMON_NOUNS),
        common2=rng.choice(COMMON_NOUNS),
        cadj=rng.choice(COMMON_ADJS),
        name=rng.choice(NAMES),
        name2=rng.choice(NAMES),
        place=rng.choice(PLACES),
        num=rng.randint(2, 999),
        year=rng.randint(1890, 2030),
    )
    return text[0].upper() + text[1:]


def topics(seed: int = 7) -> list[tuple[str, list[str]]]:
    """(domain, focus nouns): 20 domains, 12 topics each, of four nouns each."""
    rng = random.Random(seed)
    out = []
    for name, domain in DOMAINS.items():
        for _ in range(12):
            out.append((name, rng.sample(domain["nouns"], 4)))
    return out


def passages(n: int, *, seed: int = 11) -> list[tuple[str, str]]:
    """`n` (title, passage) pairs of three or four sentences each (about 50 word pieces)."""
    rng = random.Random(seed)
    all_topics = topics()
    out = []
    for i in range(n):
        domain_name, focus = all_topics[rng.randrange(len(all_topics))]
        domain = DOMAINS[domain_name]
        body = " ".join(_sentence(rng, domain, focus) for _ in range(rng.choice((3, 3, 4))))
        title = f"{domain_name.title()} notes {i // 100 + 1}: the {focus[0]} and the {focus[1]}"
        out.append((title, body))
    return out


def questions(n: int, *, seed: int = 13) -> list[str]:
    """Short questions a reader of such a corpus might ask (not drawn from the passages)."""
    rng = random.Random(seed)
    all_topics = topics()
    forms = [
        "how does the {adj} {a} affect the {b}?",
        "what {verb} the {a} in {place}?",
        "{a} and {b}: why is it {adj}",
        "when should a {a} be {adj}?",
        "who {verb} the {b} near the {a}",
    ]
    out = []
    for _ in range(n):
        domain_name, focus = all_topics[rng.randrange(len(all_topics))]
        domain = DOMAINS[domain_name]
        out.append(
            rng.choice(forms).format(
                a=rng.choice(focus),
                b=rng.choice(domain["nouns"]),
                adj=rng.choice(domain["adjs"]),
                verb=rng.choice(domain["verbs"]),
                place=rng.choice(PLACES),
            )
        )
    return out
