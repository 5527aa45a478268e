"""Generate the demo datasets LLaMA-Factory users know by name into data/ (deterministic: rerunning gives identical files).

    python scripts/make_lf_demo_data.py [--out data] [--lf-info tests/fixtures/llamafactory/data/dataset_info.json]

LLaMA-Factory's example configs name local demo sets (alpaca_en_demo, identity, dpo_en_demo, c4_demo, ...)
and hub datasets (alpaca_en, ultrachat_200k, ...). So that those configs run unchanged, tunesmith ships
datasets under the same names with the same dataset_info.json entries (formatting, columns, tags and
roles); the records are tunesmith's own, written here (LLaMA-Factory's data text is not copied), and
small (10-60 records each). identity and the mllm_* media demos come from make_demo_data.py and
make_mllm_demo_data.py.

The hub entries (hf_hub_url / ms_hub_url / om_hub_url, no file) are taken unchanged from the pinned
LLaMA-Factory dataset_info.json (--lf-info; see tests/fixtures/llamafactory/NOTICE), except where
tunesmith already ships a local dataset of that name (mllm_pt_demo), which is kept. The other
entries of data/dataset_info.json are kept as they are.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LF_INFO = REPO / "tests" / "fixtures" / "llamafactory" / "data" / "dataset_info.json"

_CHAT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}

# The entries of the local sets this script writes: exactly LLaMA-Factory's.
DATASET_INFO = {
    "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
    "alpaca_zh_demo": {"file_name": "alpaca_zh_demo.json"},
    "glaive_toolcall_en_demo": {"file_name": "glaive_toolcall_en_demo.json", "formatting": "sharegpt",
                                "columns": {"messages": "conversations", "tools": "tools"}},
    "glaive_toolcall_zh_demo": {"file_name": "glaive_toolcall_zh_demo.json", "formatting": "sharegpt",
                                "columns": {"messages": "conversations", "tools": "tools"}},
    "dpo_en_demo": {"file_name": "dpo_en_demo.json", "ranking": True, "formatting": "sharegpt",
                    "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
    "dpo_zh_demo": {"file_name": "dpo_zh_demo.json", "ranking": True, "formatting": "sharegpt",
                    "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
    "kto_en_demo": {"file_name": "kto_en_demo.json", "formatting": "sharegpt",
                    "columns": {"messages": "messages", "kto_tag": "label"}, "tags": dict(_CHAT_TAGS)},
    "wiki_demo": {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}},
    "c4_demo": {"file_name": "c4_demo.jsonl", "columns": {"prompt": "text"}},
}


# ---------------------------------------------------------------- alpaca_en_demo / alpaca_zh_demo

ALPACA_EN = [
    ("Give three tips for keeping a houseplant healthy.", "",
     "1. Water it only when the top few centimetres of soil are dry; most houseplants suffer more from too much "
     "water than from too little.\n2. Give it the light its species needs: a succulent wants a sunny window, a fern "
     "prefers bright shade.\n3. Use a pot with drainage holes so the roots never stand in water."),
    ("Explain what a leap year is.", "",
     "A leap year has 366 days instead of 365: February gets a 29th day. It keeps the calendar in step with the "
     "Earth's orbit, which takes about 365.24 days. In the Gregorian calendar a year is a leap year if it is "
     "divisible by 4, except century years, which must be divisible by 400 (2000 was a leap year, 1900 was not)."),
    ("Rewrite the sentence in the passive voice.", "The committee approved the new budget.",
     "The new budget was approved by the committee."),
    ("Translate the sentence into French.", "Where is the train station?", "Où est la gare ?"),
    ("Classify the animal as a mammal, bird, reptile, amphibian or fish.", "frog", "Amphibian."),
    ("Summarize the paragraph in one sentence.",
     "The town library will stay open until nine in the evening from next month. The longer hours follow a survey "
     "in which most residents said they could only visit after work. The extra staff will be paid from the "
     "council's culture budget.",
     "From next month the library stays open until 9 p.m. because residents asked for after-work hours, with the "
     "extra staff paid by the council."),
    ("Write a haiku about autumn rain.", "",
     "Cold rain on the roof\nmaple leaves slide down the glass\nthe kettle hums on"),
    ("What is the boiling point of water at sea level?", "",
     "At sea level water boils at 100 °C, which is 212 °F."),
    ("List the primary colors of light.", "", "Red, green and blue."),
    ("Convert the temperature from Celsius to Fahrenheit.", "25 °C",
     "25 °C is 77 °F (25 × 9/5 + 32 = 77)."),
    ("Find the grammatical error and correct the sentence.", "She don't like coffee.",
     "The verb must agree with the subject \"she\": \"She doesn't like coffee.\""),
    ("Suggest a name for a bakery that specializes in sourdough bread.", "",
     "\"Slow Rise\": it hints at the long fermentation that gives sourdough its flavour."),
    ("Explain the difference between weather and climate.", "",
     "Weather is the state of the atmosphere at a given place and time: today's rain, wind or temperature. "
     "Climate is the average pattern of weather in a region over many years, usually thirty or more. Weather "
     "tells you whether to take an umbrella today; climate tells you whether to own one."),
    ("Write a Python function that returns the factorial of a non-negative integer.", "",
     "def factorial(n: int) -> int:\n    if n < 0:\n        raise ValueError(\"n must be non-negative\")\n"
     "    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result"),
    ("Give an antonym for each word.", "ancient, generous, fragile", "modern, stingy, sturdy"),
    ("Describe how to make a cup of black tea.", "",
     "1. Boil fresh water.\n2. Warm the cup or pot with a little of it and pour that away.\n3. Add one tea bag or "
     "a teaspoon of loose leaves per cup and pour on the water just off the boil.\n4. Steep for three to five "
     "minutes, then remove the tea.\n5. Add milk, lemon or sugar if you like."),
    ("What does the abbreviation CPU stand for?", "",
     "CPU stands for central processing unit, the part of a computer that carries out the instructions of programs."),
    ("Sort the numbers from smallest to largest.", "42, 7, 19, 3, 88", "3, 7, 19, 42, 88"),
    ("Write a short, polite email declining a meeting invitation.", "",
     "Subject: Re: Project sync on Thursday\n\nHi Maria,\n\nThank you for the invitation. Unfortunately I already "
     "have a commitment at that time and cannot attend. Could you share the notes afterwards? I am happy to send "
     "my update in writing beforehand.\n\nBest regards,\nTom"),
    ("Explain photosynthesis to a ten-year-old.", "",
     "Plants make their own food. Their leaves catch sunlight, and they use that energy to turn water from the "
     "soil and carbon dioxide from the air into sugar. The sugar feeds the plant, and as a bonus the plant lets "
     "out oxygen, which is the air we breathe."),
    ("Name the largest planet in the solar system.", "",
     "Jupiter. It is a gas giant, and more than 1,300 Earths would fit inside it."),
    ("Identify the main idea of the text.",
     "Many cities are planting trees along their streets. Trees give shade, cool the air in summer, soak up rain "
     "and make neighbourhoods more pleasant to walk in.",
     "Street trees make cities cooler, better at handling rain and nicer to live in, so many cities plant them."),
    ("Create a shopping list for making pancakes.", "",
     "- Flour\n- Eggs\n- Milk\n- Butter\n- Sugar\n- Baking powder\n- Salt\n- Toppings such as maple syrup, berries "
     "or lemon"),
    ("Is the statement true or false? Explain briefly.",
     "The Great Wall of China is visible from the Moon with the naked eye.",
     "False. The wall is long but only a few metres wide; from the Moon, about 384,000 km away, it is far too "
     "narrow to see without a telescope."),
    ("Calculate the area of the rectangle.", "length 8 m, width 5 m", "40 square metres (8 m × 5 m)."),
    ("Give a synonym for the word.", "happy", "Joyful."),
    ("Write one encouraging sentence for someone who has just started learning the piano.", "",
     "Every piece you will ever love playing starts with the slow, clumsy practice you are doing now, so keep going."),
    ("Explain what a noun is and give two examples.", "",
     "A noun is a word that names a person, place, thing or idea. For example, \"teacher\" and \"river\" are nouns."),
    ("How many minutes are there in a day?", "", "There are 1,440 minutes in a day (24 hours × 60 minutes)."),
    ("Turn the list into one sentence.", "eggs, flour, sugar, butter",
     "To bake the cake you need eggs, flour, sugar and butter."),
    ("Describe the water cycle in three steps.", "",
     "1. Evaporation: the sun heats water in seas, lakes and plants, and it rises as vapour.\n2. Condensation: the "
     "vapour cools high up and forms clouds of tiny droplets.\n3. Precipitation: the droplets join, fall as rain or "
     "snow, and flow back into rivers and seas."),
    ("What is the past tense of the verb?", "run", "Ran."),
    ("Recommend one simple way to reduce plastic waste at home.", "",
     "Keep a few reusable bags by the door or in your car, so you never need a plastic bag when you shop."),
    ("Explain why the sky is blue.", "",
     "Sunlight contains all colours. When it passes through the air, its light is scattered by gas molecules, "
     "and short wavelengths such as blue are scattered much more than long ones such as red. That scattered blue "
     "light reaches our eyes from every direction, so the whole sky looks blue."),
    ("Generate a title for an article about staying productive while working from home.", "",
     "Home Office, Real Focus: Simple Habits for Productive Remote Work"),
    ("Check whether the number is prime.", "91", "91 is not prime: 91 = 7 × 13."),
    ("Write a riddle whose answer is \"a shadow\".", "",
     "I follow you all day but vanish at night; I grow long in the evening and short at noon. What am I?"),
    ("Compare cats and dogs as pets in two sentences.", "",
     "Cats are independent, need little space and are happy to be left alone for a working day. Dogs need daily "
     "walks and company, but they are eager to learn and form very close bonds with their owners."),
    ("Extract the date from the sentence.", "The conference will take place on 14 March 2025 in Lisbon.",
     "14 March 2025"),
    ("What is the main job of the heart?", "",
     "The heart is a muscle that pumps blood around the body, carrying oxygen and nutrients to the organs and "
     "taking carbon dioxide back to the lungs."),
]

ALPACA_ZH = [
    ("给出保持室内植物健康的三个建议。", "",
     "1. 等土壤表层干了再浇水，大多数室内植物更怕浇水过多。\n2. 按照植物的习性安排光照：多肉喜欢阳光充足的窗台，蕨类喜欢明亮的散射光。\n"
     "3. 使用底部有排水孔的花盆，避免根部长期泡在水里。"),
    ("解释什么是闰年。", "",
     "闰年有 366 天，比平年多出 2 月 29 日这一天，用来让日历与地球公转周期（约 365.24 天）保持一致。公历规定：能被 4 整除的年份是闰年，"
     "但整百年份必须能被 400 整除才是闰年，例如 2000 年是闰年，1900 年不是。"),
    ("把这句话改写成被动句。", "小明打碎了窗户。", "窗户被小明打碎了。"),
    ("把这句话翻译成英文。", "请问火车站在哪里？", "Excuse me, where is the train station?"),
    ("判断这种动物属于哺乳动物、鸟类、爬行动物、两栖动物还是鱼类。", "青蛙", "两栖动物。"),
    ("用一句话概括这段文字。",
     "从下个月起，市图书馆将延长开放时间至晚上九点。此前的调查显示，多数市民只能在下班后前往图书馆。新增的人员费用由市文化预算承担。",
     "应市民下班后借阅的需求，市图书馆下月起开放到晚上九点，新增费用由文化预算承担。"),
    ("写一首关于秋雨的五言短诗。", "",
     "秋雨敲窗冷，\n黄叶满阶前。\n炉边茶正沸，\n灯下读残篇。"),
    ("水在标准大气压下的沸点是多少？", "", "在标准大气压下，水的沸点是 100 摄氏度。"),
    ("光的三原色是什么？", "", "红、绿、蓝。"),
    ("把温度从摄氏度换算成华氏度。", "25 摄氏度", "25 摄氏度等于 77 华氏度（25 × 9/5 + 32 = 77）。"),
    ("找出句子中的错误并改正。", "我们要发扬和继承优良传统。",
     "语序不当，应先“继承”后“发扬”：“我们要继承和发扬优良传统。”"),
    ("为一家专做手工面条的小店起个名字。", "", "“一碗拉面馆”：名字简单好记，也点出了手工现做的特色。"),
    ("解释天气和气候的区别。", "",
     "天气是某地某一时刻的大气状况，比如今天是否下雨、刮风、气温多少；气候是一个地区多年（通常三十年以上）天气的平均状况。"
     "天气决定今天要不要带伞，气候决定你家里需不需要准备雨伞。"),
    ("用 Python 写一个计算非负整数阶乘的函数。", "",
     "def factorial(n: int) -> int:\n    if n < 0:\n        raise ValueError(\"n 必须是非负整数\")\n"
     "    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result"),
    ("分别写出下列词语的反义词。", "古老、慷慨、脆弱", "现代、吝啬、坚固"),
    ("介绍泡一杯绿茶的步骤。", "",
     "1. 把水烧开后稍微放凉到 80 摄氏度左右。\n2. 用少量热水温杯后倒掉。\n3. 放入约 3 克茶叶，先倒少量水润茶。\n"
     "4. 再沿杯壁注水至七分满。\n5. 等两三分钟，茶叶舒展后即可饮用。"),
    ("CPU 是什么的缩写？", "", "CPU 是 central processing unit 的缩写，即中央处理器，负责执行计算机程序的指令。"),
    ("把这些数字从小到大排列。", "42、7、19、3、88", "3、7、19、42、88"),
    ("写一封礼貌地婉拒会议邀请的简短邮件。", "",
     "主题：回复：周四项目例会\n\n王经理您好：\n\n感谢您的邀请。很抱歉，我那个时间已有其他安排，无法参加。"
     "方便的话，请会后把会议纪要发给我，我也可以提前把我的进展以书面形式发给大家。\n\n此致\n李明"),
    ("向一个十岁的孩子解释光合作用。", "",
     "植物会自己“做饭”。它们的叶子接住阳光，用阳光的能量把根吸上来的水和空气里的二氧化碳变成糖，糖就是植物的食物。"
     "在这个过程中，植物还会放出氧气，就是我们呼吸的空气。"),
    ("太阳系中最大的行星是哪一颗？", "", "木星。它是一颗气态巨行星，体积是地球的一千三百多倍。"),
    ("找出这段话的中心思想。",
     "许多城市正在街道两旁种树。树木可以遮阳、在夏天降低气温、吸收雨水，还让街区更适合步行。",
     "行道树能让城市更凉爽、更好地应对降雨、更宜居，所以很多城市都在种树。"),
    ("列出做西红柿炒鸡蛋需要买的东西。", "", "- 西红柿\n- 鸡蛋\n- 葱\n- 食用油\n- 盐\n- 白糖（可选）"),
    ("判断下面的说法是否正确，并简要说明。", "在月球上用肉眼可以看到万里长城。",
     "不正确。长城虽然很长，但只有几米宽；月球距离地球约 38 万公里，在那里不借助望远镜根本看不到这么窄的建筑。"),
    ("计算长方形的面积。", "长 8 米，宽 5 米", "40 平方米（8 米 × 5 米）。"),
    ("写出这个词的一个近义词。", "高兴", "快乐。"),
    ("给刚开始学钢琴的人写一句鼓励的话。", "", "你将来喜欢弹奏的每一首曲子，都是从现在这些缓慢而笨拙的练习开始的，坚持下去！"),
    ("什么是名词？请举两个例子。", "", "名词是表示人、事物、地点或抽象概念名称的词，例如“老师”和“河流”。"),
    ("一天有多少分钟？", "", "一天有 1440 分钟（24 小时 × 60 分钟）。"),
    ("用这些词语造一个句子。", "春天、公园、风筝", "春天到了，孩子们在公园里放风筝。"),
    ("用三个步骤描述水循环。", "",
     "1. 蒸发：太阳加热海洋、湖泊和植物中的水，水变成水蒸气上升。\n2. 凝结：水蒸气在高空遇冷，凝结成小水滴，形成云。\n"
     "3. 降水：小水滴聚集变大，以雨或雪的形式落下，再流回江河湖海。"),
    ("“画蛇添足”是什么意思？", "", "比喻做了多余的事，反而把事情弄糟。"),
    ("推荐一个在家减少塑料垃圾的简单方法。", "", "在门口或车里常备几个可重复使用的购物袋，买东西时就不用再要塑料袋了。"),
    ("解释天空为什么是蓝色的。", "",
     "阳光中包含各种颜色的光。阳光穿过大气时会被空气分子散射，波长较短的蓝光比波长较长的红光散射得多得多。"
     "被散射的蓝光从四面八方进入我们的眼睛，所以整个天空看起来是蓝色的。"),
    ("为一篇关于居家办公效率的文章拟一个标题。", "", "在家也高效：远程办公的五个好习惯"),
    ("判断这个数是不是质数。", "91", "91 不是质数，因为 91 = 7 × 13。"),
    ("写一个谜底是“影子”的谜语。", "", "白天跟着你走，夜里不见踪影；早晚长长一条，中午缩成一团。（打一自然现象）"),
    ("用两句话比较猫和狗作为宠物的特点。", "",
     "猫比较独立，不需要太大空间，主人上班一整天它也能自己待着。狗需要每天遛弯和陪伴，但它们很愿意学习，和主人的感情也更亲密。"),
    ("从句子中提取日期。", "会议将于 2025 年 3 月 14 日在杭州举行。", "2025 年 3 月 14 日"),
    ("心脏的主要功能是什么？", "", "心脏是一块肌肉，负责把血液泵送到全身，为器官输送氧气和养分，并把二氧化碳带回肺部排出。"),
]


def make_alpaca(rows: list[tuple[str, str, str]]) -> list[dict]:
    return [{"instruction": i, "input": q, "output": o} for i, q, o in rows]


# ---------------------------------------------------------------- glaive_toolcall_en_demo / _zh_demo
#
# Tool-use conversations: every tool's result is computed here (BMI, tips, loan payments, conversions with
# the rate the tool returns), so the final answers are consistent with the observations.

def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}


def _prop(kind: str, description: str, **extra) -> dict:
    return {"type": kind, "description": description, **extra}


TOOLS_EN = {
    "get_current_weather": _tool("get_current_weather", "Get the current weather in a city", {
        "city": _prop("string", "The city name, e.g. Berlin"),
        "unit": _prop("string", "The temperature unit", enum=["celsius", "fahrenheit"])}, ["city"]),
    "convert_currency": _tool("convert_currency", "Convert an amount of money from one currency to another", {
        "amount": _prop("number", "The amount to convert"),
        "from_currency": _prop("string", "The currency code to convert from, e.g. USD"),
        "to_currency": _prop("string", "The currency code to convert to, e.g. EUR")},
        ["amount", "from_currency", "to_currency"]),
    "calculate_bmi": _tool("calculate_bmi", "Calculate the body mass index (BMI)", {
        "weight_kg": _prop("number", "The weight in kilograms"),
        "height_m": _prop("number", "The height in metres")}, ["weight_kg", "height_m"]),
    "calculate_tip": _tool("calculate_tip", "Calculate the tip for a restaurant bill", {
        "bill_amount": _prop("number", "The total bill"),
        "tip_percent": _prop("number", "The tip in percent")}, ["bill_amount", "tip_percent"]),
    "calculate_loan_payment": _tool("calculate_loan_payment", "Calculate the monthly payment of a loan", {
        "principal": _prop("number", "The loan amount"),
        "annual_rate": _prop("number", "The annual interest rate in percent"),
        "years": _prop("integer", "The loan term in years")}, ["principal", "annual_rate", "years"]),
    "create_reminder": _tool("create_reminder", "Create a reminder at a date and time", {
        "title": _prop("string", "What to be reminded of"),
        "datetime": _prop("string", "When, as YYYY-MM-DD HH:MM")}, ["title", "datetime"]),
}

TOOLS_ZH = {
    "get_current_weather": _tool("get_current_weather", "查询某个城市当前的天气", {
        "city": _prop("string", "城市名称，例如北京"),
        "unit": _prop("string", "温度单位", enum=["celsius", "fahrenheit"])}, ["city"]),
    "convert_currency": _tool("convert_currency", "把一笔钱从一种货币换算成另一种货币", {
        "amount": _prop("number", "要换算的金额"),
        "from_currency": _prop("string", "原货币代码，例如 CNY"),
        "to_currency": _prop("string", "目标货币代码，例如 USD")}, ["amount", "from_currency", "to_currency"]),
    "calculate_bmi": _tool("calculate_bmi", "计算身体质量指数（BMI）", {
        "weight_kg": _prop("number", "体重，单位千克"),
        "height_m": _prop("number", "身高，单位米")}, ["weight_kg", "height_m"]),
    "calculate_tip": _tool("calculate_tip", "计算餐厅账单的小费", {
        "bill_amount": _prop("number", "账单总额"),
        "tip_percent": _prop("number", "小费百分比")}, ["bill_amount", "tip_percent"]),
    "calculate_loan_payment": _tool("calculate_loan_payment", "计算贷款的每月还款额", {
        "principal": _prop("number", "贷款金额"),
        "annual_rate": _prop("number", "年利率（百分比）"),
        "years": _prop("integer", "贷款年限")}, ["principal", "annual_rate", "years"]),
    "create_reminder": _tool("create_reminder", "在指定的日期和时间创建提醒", {
        "title": _prop("string", "提醒的内容"),
        "datetime": _prop("string", "提醒时间，格式为 YYYY-MM-DD HH:MM")}, ["title", "datetime"]),
}

CITIES_EN = ["Berlin", "Tokyo", "Nairobi", "Toronto", "Lisbon", "Seoul"]
CITIES_ZH = ["北京", "上海", "成都", "广州", "西安", "哈尔滨"]
CONDITIONS = [("sunny", "晴"), ("cloudy", "多云"), ("light rain", "小雨"), ("overcast", "阴")]
RATES = {("USD", "EUR"): 0.92, ("EUR", "USD"): 1.09, ("GBP", "JPY"): 191.5, ("CNY", "USD"): 0.14,
         ("USD", "CNY"): 7.2, ("EUR", "CNY"): 7.8}


def _call(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def _obs(result: dict) -> str:
    return json.dumps(result, ensure_ascii=False)


def _monthly_payment(principal: float, annual_rate: float, years: int) -> float:
    r, n = annual_rate / 100 / 12, years * 12
    return round(principal * r / (1 - (1 + r) ** -n), 2)


def _money(x: float) -> str:
    return f"{x:,.2f}"


def _toolcall_weather(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    city = rng.choice(CITIES_ZH if zh else CITIES_EN)
    temp, (cond_en, cond_zh) = rng.randint(-5, 32), rng.choice(CONDITIONS)
    args = {"city": city, "unit": "celsius"}
    result = {"city": city, "temperature": temp, "unit": "celsius", "condition": cond_zh if zh else cond_en}
    if zh:
        turns = [("human", f"{city}现在天气怎么样？"), ("function_call", _call("get_current_weather", args)),
                 ("observation", _obs(result)), ("gpt", f"{city}现在天气{cond_zh}，气温 {temp} 摄氏度。")]
    else:
        turns = [("human", f"What's the weather like in {city} right now?"),
                 ("function_call", _call("get_current_weather", args)), ("observation", _obs(result)),
                 ("gpt", f"It is currently {cond_en} in {city}, at {temp} °C.")]
    return ["get_current_weather"], turns


def _toolcall_currency(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    (src, dst), amount = rng.choice(sorted(RATES)), rng.choice([50, 120, 300, 1000, 2500])
    rate = RATES[(src, dst)]
    converted = round(amount * rate, 2)
    args = {"amount": amount, "from_currency": src, "to_currency": dst}
    result = {"converted_amount": converted, "rate": rate, "from_currency": src, "to_currency": dst}
    if zh:
        return ["convert_currency"], [
            ("human", f"帮我把 {amount} {src} 换算成 {dst}。"), ("function_call", _call("convert_currency", args)),
            ("observation", _obs(result)), ("gpt", f"按汇率 {rate} 计算，{amount} {src} 约等于 {_money(converted)} {dst}。")]
    return ["convert_currency"], [
        ("human", f"How much is {amount} {src} in {dst}?"), ("function_call", _call("convert_currency", args)),
        ("observation", _obs(result)), ("gpt", f"At a rate of {rate}, {amount} {src} is about {_money(converted)} {dst}.")]


def _toolcall_bmi(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """The user gives the weight first; the assistant asks for the height."""
    weight, height = rng.randint(50, 95), rng.choice([1.58, 1.65, 1.70, 1.75, 1.82, 1.90])
    bmi = round(weight / height ** 2, 1)
    args = {"weight_kg": weight, "height_m": height}
    if zh:
        category = "偏瘦" if bmi < 18.5 else "正常" if bmi < 25 else "超重" if bmi < 30 else "肥胖"
        return ["calculate_bmi"], [
            ("human", f"我想算一下我的 BMI，我体重 {weight} 公斤。"), ("gpt", "好的，请告诉我你的身高（单位：米）。"),
            ("human", f"{height} 米。"), ("function_call", _call("calculate_bmi", args)), ("observation", _obs({"bmi": bmi})),
            ("gpt", f"你的 BMI 是 {bmi}，属于{category}范围（18.5 到 24.9 为正常）。")]
    category = "underweight" if bmi < 18.5 else "normal" if bmi < 25 else "overweight" if bmi < 30 else "obese"
    return ["calculate_bmi"], [
        ("human", f"Can you work out my BMI? I weigh {weight} kg."), ("gpt", "Sure. What is your height in metres?"),
        ("human", f"{height} m."), ("function_call", _call("calculate_bmi", args)), ("observation", _obs({"bmi": bmi})),
        ("gpt", f"Your BMI is {bmi}, which is in the {category} range (18.5 to 24.9 counts as normal).")]


def _toolcall_tip(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    bill, percent = rng.choice([36.5, 48.0, 72.4, 95.0, 120.0]), rng.choice([10, 15, 18, 20])
    tip = round(bill * percent / 100, 2)
    args = {"bill_amount": bill, "tip_percent": percent}
    result = {"tip_amount": tip, "total": round(bill + tip, 2)}
    if zh:
        return ["calculate_tip", "convert_currency"], [
            ("human", f"账单是 {bill:.2f} 美元，我想给 {percent}% 的小费，应该给多少？"),
            ("function_call", _call("calculate_tip", args)), ("observation", _obs(result)),
            ("gpt", f"小费是 {_money(tip)} 美元，加上小费一共 {_money(bill + tip)} 美元。"),
            ("human", "谢谢！"), ("gpt", "不客气，祝你用餐愉快！")]
    return ["calculate_tip", "convert_currency"], [
        ("human", f"My bill is ${bill:.2f} and I want to leave a {percent}% tip. How much is that?"),
        ("function_call", _call("calculate_tip", args)), ("observation", _obs(result)),
        ("gpt", f"The tip is ${_money(tip)}, so the total comes to ${_money(bill + tip)}."),
        ("human", "Thanks!"), ("gpt", "You're welcome, enjoy your meal!")]


def _toolcall_loan(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    principal, rate, years = rng.choice([20000, 150000, 300000]), rng.choice([3.5, 4.2, 5.0, 6.5]), rng.choice([5, 15, 30])
    payment = _monthly_payment(principal, rate, years)
    args = {"principal": principal, "annual_rate": rate, "years": years}
    if zh:
        return ["calculate_loan_payment"], [
            ("human", f"我要贷款 {principal} 元，年利率 {rate}%，贷 {years} 年，每月要还多少？"),
            ("function_call", _call("calculate_loan_payment", args)), ("observation", _obs({"monthly_payment": payment})),
            ("gpt", f"按等额本息计算，每月需要还款约 {_money(payment)} 元。")]
    return ["calculate_loan_payment"], [
        ("human", f"What would my monthly payment be on a {years}-year loan of ${principal:,} at {rate}% a year?"),
        ("function_call", _call("calculate_loan_payment", args)), ("observation", _obs({"monthly_payment": payment})),
        ("gpt", f"Your monthly payment would be about ${_money(payment)}.")]


def _toolcall_reminder(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    day, hour = rng.randint(1, 28), rng.choice([8, 9, 14, 17, 19])
    when = f"2025-06-{day:02d} {hour:02d}:00"
    if zh:
        title = rng.choice(["给妈妈打电话", "交水电费", "去医院复查"])
        args = {"title": title, "datetime": when}
        return ["create_reminder", "get_current_weather"], [
            ("human", f"提醒我 6 月 {day} 日 {hour} 点{title}。"), ("function_call", _call("create_reminder", args)),
            ("observation", _obs({"status": "created", "title": title, "datetime": when})),
            ("gpt", f"好的，已经为你设置了提醒：6 月 {day} 日 {hour}:00 {title}。")]
    title = rng.choice(["Call the dentist", "Pay the electricity bill", "Water the garden"])
    args = {"title": title, "datetime": when}
    return ["create_reminder", "get_current_weather"], [
        ("human", f"Remind me to {title[0].lower() + title[1:]} on June {day} at {hour}:00."),
        ("function_call", _call("create_reminder", args)),
        ("observation", _obs({"status": "created", "title": title, "datetime": when})),
        ("gpt", f"Done: I set a reminder \"{title}\" for June {day} at {hour}:00.")]


def _toolcall_none(rng: random.Random, zh: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """A request the tools cannot serve: the assistant says so and answers what it can."""
    if zh:
        question, answer = rng.choice([
            ("你能帮我订一张明天去上海的高铁票吗？", "抱歉，我没有订票的工具，无法替你购票。你可以通过铁路官方的网站或手机应用购买。"),
            ("给我讲个笑话吧。", "好的：为什么数学书总是很忧郁？因为它有太多的问题。"),
            ("帮我点一份外卖。", "抱歉，我没有点外卖的功能。我可以帮你查询天气、换算货币或计算贷款等。"),
        ])
        return ["get_current_weather"], [("human", question), ("gpt", answer)]
    question, answer = rng.choice([
        ("Can you book me a flight to Paris for tomorrow?",
         "I'm sorry, I don't have a tool for booking flights. You can book one on an airline's or a travel agent's "
         "website."),
        ("Tell me a joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
        ("Please order a pizza for me.",
         "I'm sorry, I can't place orders. I can check the weather, convert currencies or calculate a loan payment."),
    ])
    return ["get_current_weather"], [("human", question), ("gpt", answer)]


_TOOLCALL_KINDS = [_toolcall_weather, _toolcall_currency, _toolcall_bmi, _toolcall_tip, _toolcall_loan,
                   _toolcall_reminder, _toolcall_none]


def make_glaive_toolcall(zh: bool, num: int = 28, seed: int = 21) -> list[dict]:
    """sharegpt conversations (human / gpt / function_call / observation) with the tools as a JSON string."""
    rng = random.Random(seed + int(zh))
    tools = TOOLS_ZH if zh else TOOLS_EN
    records = []
    for i in range(num):
        names, turns = _TOOLCALL_KINDS[i % len(_TOOLCALL_KINDS)](rng, zh)
        records.append({"conversations": [{"from": role, "value": text} for role, text in turns],
                        "tools": json.dumps([tools[n] for n in names], ensure_ascii=False)})
    return records


# ---------------------------------------------------------------- dpo_en_demo / dpo_zh_demo / kto_en_demo
#
# (prompt, better answer, worse answer): the worse one is wrong, evasive, rude or ignores the request.

PREFS_EN = [
    ("What is the capital of Australia?",
     "The capital of Australia is Canberra. Sydney and Melbourne are larger, but Canberra was chosen as a "
     "compromise between them and has been the seat of government since 1927.",
     "The capital of Australia is Sydney, its biggest city."),
    ("How many legs does a spider have?", "A spider has eight legs.", "Spiders have six legs, like all insects."),
    ("Can you explain what a variable is in programming?",
     "A variable is a named place that stores a value, so a program can use and change it later. In Python, "
     "`count = 3` creates a variable called count holding 3; `count = count + 1` then changes it to 4.",
     "It's a programming thing. Look it up, it's very basic."),
    ("Give me a tip for falling asleep faster.",
     "Keep a regular bedtime and put screens away about an hour before it: the light and the stimulation make "
     "it harder for your body to wind down.",
     "Just drink a big cup of coffee right before bed."),
    ("What is 15% of 80?", "15% of 80 is 12 (80 × 0.15).", "15% of 80 is 15."),
    ("Write a one-sentence description of the ocean for a children's book.",
     "The ocean is a huge, salty playground where whales sing, crabs scuttle and waves roll all the way to the sky.",
     "The ocean is a large body of salt water covering approximately 71% of the Earth's surface."),
    ("Translate \"good morning\" into Spanish.", "\"Good morning\" in Spanish is \"buenos días\".",
     "\"Good morning\" in Spanish is \"buenas noches\"."),
    ("Why do we have seasons?",
     "Because the Earth's axis is tilted by about 23.5 degrees. As the Earth orbits the Sun, each hemisphere "
     "is tilted towards the Sun for part of the year, getting more direct sunlight and longer days (summer), "
     "and away from it for the rest (winter).",
     "Because the Earth is much closer to the Sun in summer than in winter."),
    ("Suggest a healthy snack for the afternoon.",
     "A handful of unsalted nuts with an apple: the fibre and protein keep you full until dinner.",
     "A family-size bag of crisps and a can of cola."),
    ("How do I reverse a list in Python?",
     "Use `my_list.reverse()` to reverse it in place, or `my_list[::-1]` to get a new reversed list and keep "
     "the original.",
     "You can't reverse lists in Python; you have to write them again in the other order."),
    ("Is it safe to look directly at the Sun during a partial eclipse?",
     "No. Even during a partial eclipse the Sun's light can damage your eyes permanently. Use certified eclipse "
     "glasses or a pinhole projector.",
     "Yes, during an eclipse the Sun is covered, so it is completely safe to stare at it."),
    ("What's the plural of \"mouse\"?", "The plural of \"mouse\" is \"mice\" (for computer mice both \"mice\" and "
     "\"mouses\" are used).", "The plural of \"mouse\" is \"mouses\", never \"mice\"."),
    ("Summarize the plot of Romeo and Juliet in one sentence.",
     "Two young lovers from feuding families in Verona marry in secret, and a chain of misunderstandings ends in "
     "both of their deaths, which finally reconciles the families.",
     "It's a play by Shakespeare."),
    ("My code says \"IndexError: list index out of range\". What does that mean?",
     "It means you asked for a position the list doesn't have; for a list of 3 items the valid indexes are 0, "
     "1 and 2. Check the index you use, for example in a loop that goes one step too far.",
     "Your computer is broken. Reinstall Python."),
    ("How long should I boil an egg for a soft yolk?",
     "Put the egg into boiling water for about six minutes, then cool it in cold water: the white is set and the "
     "yolk stays runny.",
     "Boil it for about twenty minutes."),
    ("Name three renewable sources of energy.", "Solar, wind and hydroelectric power.",
     "Coal, oil and natural gas."),
    ("Can you help me write a birthday message for my grandmother?",
     "Of course! \"Happy birthday, Grandma! Thank you for all the stories, the hugs and the best apple pie in the "
     "world. I hope your day is as warm and wonderful as you are.\"",
     "Happy birthday."),
    ("What is the speed of light?",
     "In a vacuum, light travels at 299,792,458 metres per second, about 300,000 km per second.",
     "Light travels at about 300 km per hour."),
    ("Convert 3 kilometres to metres.", "3 kilometres is 3,000 metres.", "3 kilometres is 300 metres."),
    ("Which is heavier, a kilogram of feathers or a kilogram of iron?",
     "Neither: both weigh one kilogram. The feathers just take up much more space.",
     "The iron, because iron is heavier than feathers."),
]

MULTI_TURN_EN = [
    ([("human", "I'm planning a picnic this weekend."), ("gpt", "That sounds lovely! Where are you going?"),
      ("human", "A park near the river. What food should I bring?")],
     "Things that travel well and need no cooking: sandwiches or wraps, fruit such as grapes and strawberries, "
     "cheese and crackers, and plenty of water. Pack a cool bag for anything with mayonnaise or dairy.",
     "I don't know, food."),
    ([("human", "What's 12 times 12?"), ("gpt", "12 times 12 is 144."), ("human", "And 13 times 13?")],
     "13 times 13 is 169.", "13 times 13 is 156."),
    ([("human", "I want to start running."), ("gpt", "Great idea! Have you run before?"),
      ("human", "No, never. How should I begin?")],
     "Start gently: three times a week, alternate one minute of easy running with two minutes of walking for "
     "about 20 minutes, and add a little more running each week. Good shoes matter more than speed.",
     "Run a marathon this weekend, that's the fastest way to get fit."),
    ([("human", "Can you recommend a book?"), ("gpt", "Sure! What kind of books do you like?"),
      ("human", "Science fiction, but nothing too long.")],
     "Try \"The Martian\" by Andy Weir: a gripping, funny survival story on Mars that reads quickly. For "
     "something shorter still, Ted Chiang's short stories in \"Stories of Your Life and Others\" are excellent.",
     "Read a cookbook."),
]

SYSTEM_EN = ["You are a helpful and honest assistant.", "You are a friendly tutor. Answer clearly and correctly."]


def make_dpo_en(seed: int = 31) -> list[dict]:
    """Single-turn pairs (a third with a system turn) and multi-turn pairs; chosen/rejected are gpt turns."""
    rng = random.Random(seed)
    records = []
    for i, (prompt, good, bad) in enumerate(PREFS_EN):
        turns = [{"from": "human", "value": prompt}]
        if i % 3 == 2:
            turns.insert(0, {"from": "system", "value": rng.choice(SYSTEM_EN)})
        records.append({"conversations": turns, "chosen": {"from": "gpt", "value": good},
                        "rejected": {"from": "gpt", "value": bad}})
    for turns, good, bad in MULTI_TURN_EN:
        records.append({"conversations": [{"from": r, "value": t} for r, t in turns],
                        "chosen": {"from": "gpt", "value": good}, "rejected": {"from": "gpt", "value": bad}})
    return records


PREFS_ZH = [
    ("中国的首都是哪里？", "中国的首都是北京。", "中国的首都是上海，因为上海是最大的城市。"),
    ("蜘蛛有几条腿？", "蜘蛛有八条腿。", "蜘蛛和所有昆虫一样有六条腿。"),
    ("能解释一下编程里的“变量”是什么吗？",
     "变量是一个有名字的存储位置，用来保存数据，程序之后可以读取或修改它。比如在 Python 里写 `count = 3`，就创建了一个名为 count、值为 3 的变量。",
     "这是编程的基础概念，自己去查吧。"),
    ("有什么办法能让我更快入睡？", "尽量每天固定时间睡觉，睡前一小时放下手机，屏幕的光和刺激会让身体更难放松下来。", "睡前喝一大杯浓咖啡就行。"),
    ("80 的 15% 是多少？", "80 的 15% 是 12（80 × 0.15）。", "80 的 15% 是 15。"),
    ("“你好”用英语怎么说？", "“你好”的英语是 “hello”。", "“你好”的英语是 “goodbye”。"),
    ("为什么会有四季变化？",
     "因为地球的自转轴倾斜了约 23.5 度。地球绕太阳公转时，南北半球轮流更多地朝向太阳，获得更直射的阳光和更长的白天，就形成了夏季；背向太阳时就是冬季。",
     "因为地球夏天离太阳近，冬天离太阳远。"),
    ("推荐一种健康的下午加餐。", "一小把原味坚果加一个苹果，膳食纤维和蛋白质能让你一直饱到晚饭。", "一大包薯片配一罐可乐。"),
    ("Python 里怎么把列表倒序？", "用 `my_list.reverse()` 原地倒序，或者用 `my_list[::-1]` 得到一个新的倒序列表并保留原列表。",
     "Python 的列表不能倒序，只能重新手写一遍。"),
    ("日偏食的时候可以直接用眼睛看太阳吗？", "不可以。即使是日偏食，太阳光也可能对眼睛造成永久伤害，请使用合格的日食眼镜或小孔成像的方法观察。",
     "可以，日食时太阳被挡住了，直接看完全没问题。"),
    ("用一句话概括《西游记》的故事。", "唐僧在孙悟空、猪八戒、沙僧的保护下西天取经，一路降妖除魔，历经九九八十一难终于取得真经。", "这是一本古典小说。"),
    ("煮溏心蛋需要多长时间？", "把鸡蛋放进沸水里煮六分钟左右，再放进冷水中降温，蛋白凝固而蛋黄还是流心的。", "煮二十分钟左右。"),
    ("举出三种可再生能源。", "太阳能、风能和水能。", "煤炭、石油和天然气。"),
    ("帮我给奶奶写一句生日祝福。", "“奶奶生日快乐！谢谢您一直以来的疼爱和您做的最好吃的饺子，祝您身体健康，福寿安康！”", "生日快乐。"),
    ("光速是多少？", "光在真空中的速度是每秒 299,792,458 米，约每秒 30 万公里。", "光速大约是每小时 300 公里。"),
    ("3 公里等于多少米？", "3 公里等于 3000 米。", "3 公里等于 300 米。"),
    ("一公斤棉花和一公斤铁哪个重？", "一样重，都是一公斤，只是棉花的体积大得多。", "铁更重，因为铁比棉花重。"),
    ("我的程序报错“IndexError: list index out of range”，是什么意思？",
     "意思是你访问了列表中不存在的位置，比如一个有 3 个元素的列表，合法的下标只有 0、1、2。检查一下用到的下标，比如循环是否多走了一步。",
     "你的电脑坏了，重装系统吧。"),
    ("“守株待兔”是什么意思？", "比喻死守狭隘的经验，不知变通，或者妄想不劳而获。", "形容一个人非常勤劳，每天努力工作。"),
    ("一年有几个季度？", "一年有四个季度，每个季度三个月。", "一年有十二个季度。"),
]

SYSTEM_ZH = ["你是一个乐于助人、诚实可靠的助手。", "你是一位耐心的老师，请清楚准确地回答问题。"]


def make_dpo_zh(seed: int = 32) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i, (prompt, good, bad) in enumerate(PREFS_ZH):
        turns = [{"from": "human", "value": prompt}]
        if i % 4 == 3:
            turns.insert(0, {"from": "system", "value": rng.choice(SYSTEM_ZH)})
        records.append({"conversations": turns, "chosen": {"from": "gpt", "value": good},
                        "rejected": {"from": "gpt", "value": bad}})
    return records


def make_kto_en() -> list[dict]:
    """One record per preference prompt: the good answer (label true) or the bad one (false), alternating;
    the multi-turn prompts give both."""
    records = []
    for i, (prompt, good, bad) in enumerate(PREFS_EN):
        label = i % 2 == 0
        records.append({"messages": [{"role": "user", "content": prompt},
                                     {"role": "assistant", "content": good if label else bad}], "label": label})
    for turns, good, bad in MULTI_TURN_EN:
        history = [{"role": "user" if r == "human" else "assistant", "content": t} for r, t in turns]
        for label, answer in ((True, good), (False, bad)):
            records.append({"messages": history + [{"role": "assistant", "content": answer}], "label": label})
    return records


# ---------------------------------------------------------------- wiki_demo.txt / c4_demo.jsonl (stage pt)

ELEMENTS = [  # name, symbol, atomic number, state at room temperature, kind, one more fact
    ("Hydrogen", "H", 1, "gas", "nonmetal", "It is the lightest and the most abundant element in the universe."),
    ("Helium", "He", 2, "gas", "noble gas", "It is lighter than air and does not burn, so it is used to fill balloons and airships."),
    ("Carbon", "C", 6, "solid", "nonmetal", "Diamond and graphite are both made of pure carbon."),
    ("Nitrogen", "N", 7, "gas", "nonmetal", "It makes up about 78 percent of the Earth's atmosphere."),
    ("Oxygen", "O", 8, "gas", "nonmetal", "It makes up about 21 percent of the Earth's atmosphere."),
    ("Sodium", "Na", 11, "solid", "alkali metal", "It reacts strongly with water and is found in table salt."),
    ("Iron", "Fe", 26, "solid", "transition metal", "It is the main ingredient of steel."),
    ("Copper", "Cu", 29, "solid", "transition metal", "It conducts electricity well and is widely used in wires."),
    ("Gold", "Au", 79, "solid", "transition metal", "It does not rust or tarnish, so it keeps its shine for centuries."),
    ("Mercury", "Hg", 80, "liquid", "transition metal", "It is the only metal that is liquid at room temperature."),
]
PLANETS = [  # name, position from the Sun, kind, one more fact
    ("Mercury", 1, "rocky", "It is the smallest planet and the one closest to the Sun."),
    ("Venus", 2, "rocky", "Its thick atmosphere traps heat, making it the hottest planet."),
    ("Earth", 3, "rocky", "It is the only planet known to support life."),
    ("Mars", 4, "rocky", "Iron oxide dust gives it a reddish colour, hence its nickname, the Red Planet."),
    ("Jupiter", 5, "gas giant", "It is the largest planet in the Solar System."),
    ("Saturn", 6, "gas giant", "It is best known for its wide, bright ring system."),
    ("Uranus", 7, "ice giant", "It rotates on its side: its axis is tilted by about 98 degrees."),
    ("Neptune", 8, "ice giant", "It is the farthest planet from the Sun."),
]
COUNTRIES = [  # name, capital, continent, one more fact
    ("France", "Paris", "Europe", "Its official language is French."),
    ("Japan", "Tokyo", "Asia", "It is an island country made up of four main islands and thousands of smaller ones."),
    ("Kenya", "Nairobi", "Africa", "Its official languages are Swahili and English."),
    ("Brazil", "Brasília", "South America", "It is the largest country in South America, and Portuguese is its "
     "official language."),
    ("Canada", "Ottawa", "North America", "Its official languages are English and French."),
    ("Australia", "Canberra", "Oceania", "It is both a country and the smallest continent."),
    ("Egypt", "Cairo", "Africa", "The Nile, one of the longest rivers in the world, flows through it."),
    ("India", "New Delhi", "Asia", "It is one of the most populous countries in the world."),
    ("Germany", "Berlin", "Europe", "Its official language is German."),
    ("Mexico", "Mexico City", "North America", "Its most widely spoken language is Spanish."),
    ("Argentina", "Buenos Aires", "South America", "Its most widely spoken language is Spanish."),
    ("Norway", "Oslo", "Europe", "Its long coastline is cut by deep, narrow inlets called fjords."),
]
def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


_ORDINAL = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth", 7: "seventh", 8: "eighth"}


def make_wiki() -> list[str]:
    """Encyclopedia-style paragraphs, one per line (LLaMA-Factory's wiki_demo is a .txt file read line by line)."""
    lines = []
    for name, symbol, number, state, kind, fact in ELEMENTS:
        lines.append(f"{name} is a chemical element with the symbol {symbol} and atomic number {number}. It is "
                     f"classed as {_a(kind)}, and at room temperature it is {_a(state)}. {fact}")
    for name, position, kind, fact in PLANETS:
        lines.append(f"{name} is the {_ORDINAL[position]} planet from the Sun. It is a {kind} planet. {fact}")
    for name, capital, continent, fact in COUNTRIES:
        lines.append(f"{name} is a country in {continent}. Its capital is {capital}. {fact}")
    return lines


C4_EN = [
    "Our community garden on Elm Street is looking for volunteers this spring. No experience is needed: we will "
    "show you how to plant, water and weed, and you can take home a share of the vegetables. Drop by any Saturday "
    "morning between nine and noon.",
    "This lightweight backpack has a padded laptop sleeve, two side pockets for water bottles and a hidden pocket "
    "for your passport. The fabric is water-resistant, and the straps can be adjusted for a comfortable fit on long "
    "days.",
    "If your bike chain squeaks, it probably needs cleaning and oil. Wipe the chain with a dry rag, apply one drop "
    "of chain oil to each link while turning the pedals backwards, then wipe off the excess so it does not collect "
    "dirt.",
    "The recipe below makes twelve oat cookies. You will need rolled oats, flour, butter, brown sugar, one egg, a "
    "pinch of salt and a handful of raisins. Bake them at 180 degrees for twelve to fifteen minutes, until the "
    "edges are golden.",
    "The city council has announced that the main square will be closed to cars every Sunday during the summer. "
    "Market stalls, street musicians and a play area for children will take over the space from 10 a.m. to 6 p.m.",
    "Looking for a quiet weekend away? Our cabins sit at the edge of the forest, a short walk from the lake. Each "
    "cabin has a wood stove, a small kitchen and a porch where you can watch the sunset.",
    "Learning a new language as an adult is easier when you practise a little every day. Ten minutes of reading, "
    "listening to a podcast on your commute, or labelling things around your home can add up to real progress "
    "over a few months.",
    "Thank you to everyone who came to our school's science fair last Friday. More than forty students showed "
    "projects, from homemade volcanoes to a solar-powered fan. The winners will represent the school at the "
    "regional fair in May.",
    "Before you repaint a room, move the furniture to the middle and cover it, fill small holes with filler, and "
    "tape the edges of windows and doors. Two thin coats of paint look better than one thick one.",
    "Our bakery opens at seven every morning with fresh bread, croissants and cinnamon rolls. On Fridays we bake a "
    "rye loaf with seeds that usually sells out by noon, so come early or call ahead to reserve one.",
    "A good pair of walking shoes should feel comfortable from the first day. Try them on in the afternoon, when "
    "your feet are slightly larger, and wear the socks you plan to walk in.",
    "The museum's new exhibition tells the story of the town's harbour, from the first fishing boats to the "
    "container ships of today. Old photographs, maps and a model of the lighthouse are on display until October.",
    "Composting kitchen scraps is a simple way to reduce household waste. Fruit and vegetable peels, coffee grounds "
    "and eggshells can all go in the bin; keep out meat, dairy and oily food, which attract pests.",
    "Join our beginners' yoga class every Tuesday evening at the community centre. Bring a mat and comfortable "
    "clothes. The class is slow and gentle, and the instructor shows easier versions of every pose.",
    "Many people feel tired in the middle of the afternoon. A short walk outside, a glass of water or a few minutes "
    "away from the screen often helps more than another cup of coffee.",
    "The local football club is holding trials for its under-12 team next week. Players should bring boots, shin "
    "pads and a water bottle. Parents are welcome to stay and watch from the stand.",
    "This ceramic mug holds 350 millilitres and keeps your tea warm with its thick walls. It is safe for the "
    "dishwasher and the microwave, and each one is glazed by hand, so no two are exactly alike.",
    "Planning a road trip? Check your tyre pressure and oil before you leave, download offline maps in case you "
    "lose signal, and plan a break every two hours to stretch your legs.",
    "The library's summer reading challenge starts on the first of July. Children who read six books during the "
    "holidays receive a certificate and a medal, and every book they read counts, including comics and audiobooks.",
    "Houseplants that tolerate low light include the snake plant, the ZZ plant and the pothos. They are a good "
    "choice for offices and north-facing rooms, and they forgive the occasional missed watering.",
    "Our repair café meets on the last Sunday of every month. Bring a broken lamp, a torn jacket or a bicycle with "
    "a flat tyre, and our volunteers will help you fix it for free.",
    "A well-written cover letter is short and specific. Say which job you are applying for, give two or three "
    "examples of what you have done that fit the role, and end by saying when you are available for an interview.",
    "The weather this weekend will be mild and dry, with sunny spells on Saturday and a light breeze. Clouds will "
    "build on Sunday evening, and rain is expected to reach the coast on Monday morning.",
    "Homemade vegetable soup is a good way to use up what is left in the fridge. Soften an onion in a little oil, "
    "add chopped carrots, potatoes and any other vegetables, cover with stock and simmer for twenty minutes.",
]


def build_all(lf_info_path: Path = LF_INFO, existing_info_text: str | None = None) -> dict[str, str]:
    """File name -> exact file text, for every generated file and the merged dataset_info.json."""
    def as_json(obj) -> str:
        return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"

    texts = {
        "alpaca_en_demo.json": as_json(make_alpaca(ALPACA_EN)),
        "alpaca_zh_demo.json": as_json(make_alpaca(ALPACA_ZH)),
        "glaive_toolcall_en_demo.json": as_json(make_glaive_toolcall(zh=False)),
        "glaive_toolcall_zh_demo.json": as_json(make_glaive_toolcall(zh=True)),
        "dpo_en_demo.json": as_json(make_dpo_en()),
        "dpo_zh_demo.json": as_json(make_dpo_zh()),
        "kto_en_demo.json": as_json(make_kto_en()),
        "wiki_demo.txt": "".join(line + "\n" for line in make_wiki()),
        "c4_demo.jsonl": "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in C4_EN),
    }
    texts["dataset_info.json"] = merged_dataset_info(existing_info_text, lf_info_path)
    return texts


def hub_entries(lf_info: dict, existing: dict) -> dict:
    """LLaMA-Factory's hub entries (no file_name), unchanged; a name tunesmith ships as a local file keeps that."""
    return {name: entry for name, entry in lf_info.items()
            if "file_name" not in entry and "file_name" not in existing.get(name, {})}


def merged_dataset_info(existing_text: str | None, lf_info_path: Path = LF_INFO) -> str:
    """The existing dataset_info.json with our entries and LLaMA-Factory's hub entries added (or replaced in place)."""
    info = json.loads(existing_text) if existing_text else {}
    lf_info = json.loads(Path(lf_info_path).read_text(encoding="utf-8"))
    for name, entry in DATASET_INFO.items():
        assert lf_info.get(name, entry) == entry, f"{name}: our entry differs from LLaMA-Factory's"
    info.update(DATASET_INFO)
    info.update(hub_entries(lf_info, info))
    return json.dumps(info, ensure_ascii=False, indent=2) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "data"))
    parser.add_argument("--lf-info", default=str(LF_INFO), help="LLaMA-Factory's data/dataset_info.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info_path = out / "dataset_info.json"
    existing = info_path.read_text(encoding="utf-8") if info_path.exists() else None
    for file_name, text in build_all(Path(args.lf_info), existing).items():
        (out / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {out / file_name} ({len(text.encode('utf-8'))} bytes)")


if __name__ == "__main__":
    main()
