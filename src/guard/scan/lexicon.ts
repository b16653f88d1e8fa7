// SECURITY-CRITICAL: the multilingual lexicon of the MCP definition scanner (issue 35): the same attack
// structure as rules.ts (override of earlier instructions, secrecy toward the user, data moving from a
// sensitive source into a field) in Spanish, French, German, Portuguese, Italian, Chinese, Japanese,
// Korean, Russian and Arabic. Offline and in the repository: no model, no download. Latin-script text
// is matched without diacritics (the text is lower-cased and stripped first), so "contraseña" and
// "contrasena" both match. A sentence that also carries a negation only counts for secrecy and
// override, never for data movement ("n'incluez pas de mots de passe" is guidance, not an attack).
import type { Hit } from './types.js';

interface Lang {
  lang: string;
  override: RegExp;
  secrecy: RegExp;
  source: RegExp;
  move: RegExp;
  negation: RegExp;
  precondition: RegExp;
}

const PATHS = String.raw`id_(?:rsa|ed25519|ecdsa)|\.env\b|\.ssh\b|\.aws\b`;

const LANGS: Lang[] = [
  {
    lang: 'Spanish',
    override:
      /\b(?:ignora|ignore|ignorar|olvida|olvide)\w* (?:todas |todo )?(?:las |lo )?(?:instrucciones|indicaciones|ordenes)(?: \w+)? (?:anteriores|previas)|instrucciones anteriores quedan? (?:anuladas|sin efecto)/,
    secrecy:
      /\bno (?:se lo |le |lo )?(?:digas|diga|cuentes|cuente|menciones|mencione|informes|informe|avises|avise)\b|\bsin (?:que (?:el usuario|la persona|nadie) (?:lo )?sepa|dec[ií]rselo|decirle|avisar(?:le)?|informar(?:le)?)|\ben secreto\b|\bsecretamente\b|\ba escondidas\b/,
    source: new RegExp(
      String.raw`contrasenas?|claves? (?:privadas?|de api|api)|credenciales|tokens?\b|historial|conversacion|${PATHS}`,
    ),
    move: /\b(?:envia|envie|enviar|manda|mande|incluy\w*|incluir|pon|ponga|adjunta|adjunte|pasa|pase|copia|copie|sube|suba|reenvia)\b/,
    negation: /\bno (?:incluy|pong|envi|mand|compart|pase|adjunt)/,
    precondition: /antes de (?:usar|utilizar|llamar a) esta herramienta/,
  },
  {
    lang: 'French',
    override:
      /\b(?:ignore|ignorez|ignorer|oublie|oubliez)\w* (?:toutes )?(?:les |tes |vos )?(?:instructions|consignes|directives)(?: \w+)? (?:precedentes|anterieures)/,
    secrecy:
      /\bne (?:le |lui |leur )?(?:dis|dites|mentionne|mentionnez|signale|signalez|previens|prevenez)\b[^.]{0,20}\b(?:pas|rien)\b|\bsans (?:prevenir|informer|avertir|le dire|rien dire|que l'utilisateur)|\bdiscretement\b|\ben secret\b|\bsecretement\b|\ba l'insu\b/,
    source: new RegExp(
      String.raw`mots? de passe|cles? (?:privees?|d'api|api)|identifiants|jetons?|historique|conversation|fichier de configuration|${PATHS}`,
    ),
    move: /\b(?:envoie|envoyez|envoyer|transmets|transmettez|transmet|joins|joignez|inclu\w*|mets|mettez|copie|copiez|televerse|ajoute|ajoutez)\b/,
    negation: /\bn[e']\s?\w+ pas\b|\bjamais\b/,
    precondition: /avant d'utiliser cet outil/,
  },
  {
    lang: 'German',
    override:
      /\b(?:ignorier|vergiss|vergessen)\w* (?:alle |sämtliche |samtliche )?(?:vorherigen|bisherigen|fruheren|vorigen)? ?(?:anweisungen|instruktionen|vorgaben)/,
    secrecy:
      /\bsag\w* (?:dem|der|den) (?:benutzer|nutzer|anwender)\w* nichts\b|\bohne (?:dass|den|die|es) (?:benutzer|nutzer|anwender)?\w* ?(?:es )?(?:merkt|weiss|mitbekommt|zu (?:informieren|erwahnen|sagen))|\bheimlich\b|\bverschweig\w*|\bunbemerkt\b/,
    source: new RegExp(
      String.raw`passw[oö]rt\w*|zugangsdaten|anmeldedaten|privaten? schlussel|api-?schlussel|tokens?\b|chatverlauf|gesprachsverlauf|verlauf|konversation|credentials|${PATHS}`,
    ),
    move: /\b(?:sende|sendet|senden|schick\w*|ubermittl\w*|fug\w* \w* hinzu|mitschick\w*|mitsenden|lade \w* hoch|kopier\w*|gib \w* (?:mit|weiter)|einfugen|fuge)\b/,
    negation: /\b(?:nicht|keine?n?|niemals)\b/,
    precondition: /bevor (?:du|sie) dieses (?:werkzeug|tool) (?:benutzt|verwendest|benutzen|verwenden)/,
  },
  {
    lang: 'Portuguese',
    override:
      /\b(?:ignore|ignora|ignorar|esqueca|esquece)\w* (?:todas )?(?:as )?(?:instrucoes|orientacoes)(?: \w+)? (?:anteriores|previas)/,
    secrecy:
      /\bnao (?:conte|diga|mencione|informe|avise|conta)\b|\bsem que (?:ele|ela|o usuario|a pessoa|ninguem) (?:saiba|perceba)|\bem segredo\b|\bsecretamente\b|\bescondido\b/,
    source: new RegExp(
      String.raw`senhas?|chaves? (?:privadas?|de api)|credenciais|tokens?\b|historico|conversa\b|${PATHS}`,
    ),
    move: /\b(?:envie|enviar|mande|inclua|incluir|coloque|anexe|copie|passe|encaminhe)\b/,
    negation: /\bnao (?:inclua|coloque|envie|mande|passe)/,
    precondition: /antes de usar esta ferramenta/,
  },
  {
    lang: 'Italian',
    override:
      /\b(?:ignora|ignorare|dimentica)\w* (?:tutte )?(?:le )?(?:istruzioni|indicazioni)(?: \w+)? (?:precedenti|anteriori)/,
    secrecy:
      /\bnon (?:dirlo|dire|dirgli|menzionare|informare|avvisare)\b|\bsenza (?:dire|avvisare|informare)\b|\bdi nascosto\b|\bsegretamente\b/,
    source: new RegExp(
      String.raw`password|chiavi? (?:privat\w*|api)|credenziali|token\b|cronologia|conversazione|${PATHS}`,
    ),
    move: /\b(?:invia|inviare|manda|includi|inserisci|allega|copia|passa)\b/,
    negation: /\bnon (?:includere|inserire|inviare|mandare)/,
    precondition: /prima di usare questo strumento/,
  },
  {
    lang: 'Chinese',
    override: /忽略(?:之前|以前|先前|上面|上述|前面|所有|全部)?的?(?:所有|全部)?(?:指令|指示|说明|提示|要求)/,
    secrecy: /不要(?:告诉|让|通知|提及|告知)|别(?:告诉|让)|不要让用户知道|秘密地|悄悄|偷偷|不得告知/,
    source: new RegExp(
      String.raw`密码|私钥|密钥|凭证|凭据|令牌|对话记录|聊天记录|对话历史|会话记录|${PATHS}`,
    ),
    move: /发送|放入|写入|附加|上传|传递|转发|包含|填入|放到/,
    negation: /不要(?:包含|放入|发送|写入|上传)|请勿|禁止/,
    precondition: /使用(?:此|这个|本)工具(?:之前|前)/,
  },
  {
    lang: 'Japanese',
    override: /(?:これまで|以前|前|先)の(?:すべての)?(?:指示|命令|指令)を(?:すべて)?無視/,
    secrecy:
      /(?:ユーザー|利用者|ユーザ)に(?:は)?(?:言わない|伝えない|知らせない|教えない|言わず|知られない)|内緒|こっそり|秘密に/,
    source: new RegExp(
      String.raw`パスワード|秘密鍵|認証情報|トークン|会話履歴|チャット履歴|会話の履歴|${PATHS}`,
    ),
    move: /送信|入れて|送って|添付|アップロード|渡して|含め/,
    negation: /(?:入れ|含め|送信し|送ら)ないで|禁止/,
    precondition: /このツールを(?:使う|使用する|呼び出す)前に/,
  },
  {
    lang: 'Korean',
    override: /이전의? (?:모든 )?(?:지시|지침|명령|지시사항)\S* (?:모두 )?무시/,
    secrecy: /사용자에게 (?:말하지|알리지|알려주지|이야기하지) 마|몰래|비밀로/,
    source: new RegExp(String.raw`비밀번호|암호|개인 ?키|자격 ?증명|토큰|대화 기록|채팅 기록|${PATHS}`),
    move: /보내|넣으|넣어|첨부|업로드|전달|포함/,
    negation: /(?:넣지|포함하지|보내지) 마/,
    precondition: /이 도구를 사용하기 전에/,
  },
  {
    lang: 'Russian',
    override:
      /(?:игнорируй|игнорируйте|забудь|забудьте)\S* (?:все )?(?:предыдущие|прежние|прошлые)? ?(?:инструкции|указания|команды)/,
    secrecy:
      /не (?:говори|говорите|сообщай|сообщайте|рассказывай|упоминай|упоминайте)|тайно|втайне|незаметно|без ведома/,
    source: new RegExp(
      String.raw`парол|закрыт\S* ключ|приватн\S* ключ|учетн\S* данн|токен|истори\S* (?:переписки|чата|диалога|сообщений)|переписк|${PATHS}`,
    ),
    move: /передай|отправь|добавь|вставь|приложи|загрузи|перешли|передайте|отправьте|добавьте/,
    negation: /не (?:передавай|отправляй|добавляй|вставляй|указывай)/,
    precondition: /перед использованием этого инструмента/,
  },
  {
    lang: 'Arabic',
    override: /تجاهل (?:جميع |كل )?(?:التعليمات|الأوامر|الإرشادات) (?:السابقة|الماضية)/,
    secrecy: /لا تخبر|لا تُخبر|لا تعلم|دون علم|دون أن يعلم|سرا|سراً|خفية|خلسة/,
    source: new RegExp(
      String.raw`كلمات? المرور|كلمة السر|المفتاح الخاص|المفاتيح الخاصة|بيانات الاعتماد|رموز|سجل المحادثة|المحادثة|${PATHS}`,
    ),
    move: /أرسل|ارسل|ضع|أرفق|انسخ|مرر|أضف/,
    negation: /لا (?:ترسل|تضع|ترفق)/,
    precondition: /قبل استخدام هذه الأداة/,
  },
];

/** Non-ASCII text, or ASCII text with function words of the Latin-script languages above. */
const FOREIGN =
  /[\u0080-\uffff]|\b(?:las|los|del|que|por|para|todas|les|des|une|pas|sans|toutes|der|die|das|und|nicht|dem|den|ohne|alle|nao|voce|todas|della|delle|gli|il|non|senza|tutte|instrucciones|instructions precedentes|anweisungen|instrucoes|istruzioni)\b/i;

/** Lower-cased, Latin diacritics removed; same length as the input where it matters for offsets. */
function plain(text: string): string {
  // Only Latin letters lose their marks: Cyrillic й, Hangul syllables and kana with dakuten stay whole.
  if (!/[\u0080-\uffff]/.test(text)) return text.toLowerCase();
  return text
    .toLowerCase()
    .normalize('NFD')
    .replace(/([a-z])[\u0300-\u036f]+/g, '$1')
    .normalize('NFC')
    .replace(/[\u2019\u02bc]/g, "'");
}

/** Multilingual hits in `text` (NFKC, not look-alike folded); their index is -1 (see textHits). */
export function lexiconHits(text: string, out: Hit[]): void {
  if (!FOREIGN.test(text)) return;
  const p = plain(text);
  const at = (_i: number) => -1;
  for (const l of LANGS) {
    const o = l.override.exec(p);
    if (o)
      out.push({
        ruleId: 'instruction-override',
        severity: 'high',
        what: `Overrides earlier instructions (${l.lang})`,
        index: at(o.index),
        length: o[0].length,
      });
    const s = l.secrecy.exec(p);
    if (s)
      out.push({
        ruleId: 'secrecy',
        severity: 'high',
        what: `Secrecy toward the user (${l.lang})`,
        index: at(s.index),
        length: s[0].length,
      });
    const pre = l.precondition.exec(p);
    if (pre)
      out.push({
        ruleId: 'hidden-instruction',
        severity: 'medium',
        what: `Instructions aimed at the model (${l.lang})`,
        index: at(pre.index),
        length: pre[0].length,
      });
    if (!l.source.test(p)) continue;
    for (const sentence of p.split(/[.!?。！？\n]/)) {
      const src = l.source.exec(sentence);
      const mv = src ? l.move.exec(sentence) : null;
      if (!src || !mv || l.negation.test(sentence)) continue;
      const i = p.indexOf(sentence);
      out.push({
        ruleId: 'exfiltration',
        severity: 'high',
        what: `Moves ${JSON.stringify(src[0])} into a parameter or message (${l.lang})`,
        index: at(i + Math.min(src.index, mv.index)),
        length: Math.abs(src.index - mv.index) + 1,
      });
      break;
    }
  }
}
